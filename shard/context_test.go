package shard_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/epcache/epcache/shard"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type ctxKey struct{}

// claimWith claims a fresh slot with parent and returns its flight.
func claimWith(t *testing.T, parent context.Context) *shard.Flight[int] {
	t.Helper()
	tb := newTable[int, int](t, shard.Options[int]{})
	s := tb.LoadOrInsert(1)
	_, f, ok := s.Claim(nil, parent)
	require.True(t, ok)
	return f
}

var errCause = errors.New("the cause")

// A flight's context carries its parent's values, is live until Cancel,
// and then reports Canceled with the first cause given, whether it was made
// (first method call) before or after the Cancel.
func TestFlightContext(t *testing.T) {
	parent := context.WithValue(context.Background(), ctxKey{}, "v")
	t.Run("used before Cancel", func(t *testing.T) {
		f := claimWith(t, parent)
		ctx := f.Context()
		assert.Equal(t, "v", ctx.Value(ctxKey{}))
		assert.NoError(t, ctx.Err())
		_, has := ctx.Deadline()
		assert.False(t, has)
		select {
		case <-ctx.Done():
			t.Fatal("done before Cancel")
		default:
		}
		child, stop := context.WithTimeout(ctx, time.Hour)
		defer stop()
		var after sync.WaitGroup
		after.Add(1)
		context.AfterFunc(ctx, after.Done)
		f.Cancel(errCause)
		f.Cancel(errors.New("a second cause"))
		<-ctx.Done()
		<-child.Done()
		after.Wait()
		assert.ErrorIs(t, ctx.Err(), context.Canceled)
		assert.ErrorIs(t, context.Cause(ctx), errCause)
		assert.ErrorIs(t, context.Cause(child), errCause, "derived contexts end with it")
	})
	t.Run("first used after Cancel", func(t *testing.T) {
		f := claimWith(t, parent)
		f.Cancel(errCause)
		f.Cancel(errors.New("a second cause"))
		ctx := f.Context()
		<-ctx.Done()
		assert.ErrorIs(t, ctx.Err(), context.Canceled)
		assert.ErrorIs(t, context.Cause(ctx), errCause)
		assert.Equal(t, "v", ctx.Value(ctxKey{}), "values outlive the cancellation")
	})
	t.Run("never used", func(t *testing.T) {
		f := claimWith(t, nil) // never made, so the nil parent is never looked at
		f.Cancel(errCause)
	})
}

// Many goroutines make, use and cancel one flight's context at once: one
// context is made, every user sees it end, with one cause.
func TestFlightContextConcurrentUse(t *testing.T) {
	for range 200 {
		f := claimWith(t, context.Background())
		var wg sync.WaitGroup
		ctxs := make([]context.Context, 8)
		stops := make([]context.CancelFunc, len(ctxs))
		for i := range ctxs {
			wg.Go(func() {
				ctx := f.Context()
				_ = ctx.Err()
				ctxs[i], stops[i] = context.WithCancel(ctx)
			})
		}
		wg.Go(func() { f.Cancel(errCause) })
		wg.Go(func() { f.Cancel(context.Canceled) })
		wg.Wait()
		cause := context.Cause(f.Context())
		require.Error(t, cause)
		for i, ctx := range ctxs {
			<-ctx.Done() // ended by f.Cancel, not by its own stop
			assert.Equal(t, cause, context.Cause(ctx))
			stops[i]()
		}
	}
}

// A function AfterFunc registers runs once the context ends, unless its
// stop came first; a stop after it started reports false. Registered after
// the end, it runs at once.
func TestFlightContextAfterFunc(t *testing.T) {
	f := claimWith(t, context.Background())
	ctx := f.Context()
	ran := make(chan string, 3)
	stopped := context.AfterFunc(ctx, func() { ran <- "stopped" })
	kept := context.AfterFunc(ctx, func() { ran <- "kept" })
	assert.True(t, stopped(), "a stop before the end stops it")
	assert.False(t, stopped(), "a second stop stops nothing")
	f.Cancel(errCause)
	assert.Equal(t, "kept", <-ran)
	assert.False(t, kept(), "a stop after it started")
	context.AfterFunc(ctx, func() { ran <- "late" })
	assert.Equal(t, "late", <-ran, "registered after the end: runs at once")
	select {
	case r := <-ran:
		t.Fatalf("%s ran", r)
	default:
	}
}

// A context derived through WithValue, which hides the flight's context
// from the context package, still ends with the flight, and with its cause.
func TestFlightContextDerivedThroughAValue(t *testing.T) {
	f := claimWith(t, context.Background())
	child, stop := context.WithCancel(context.WithValue(f.Context(), ctxKey{}, "w"))
	defer stop()
	f.Cancel(errCause)
	<-child.Done()
	assert.ErrorIs(t, context.Cause(child), errCause)
}

// A context derived from a flight's has ended when Cancel returns, as a
// cancelCtx's children have when its cancel does: code that hears of the
// cancellation another way (an Offer's caller) reads the derived
// context's Err at once.
func TestFlightContextDerivedEndsBeforeCancelReturns(t *testing.T) {
	for range 100 {
		f := claimWith(t, context.Background())
		child, stop := context.WithTimeout(f.Context(), time.Hour)
		grandchild, stop2 := context.WithCancel(child)
		f.Cancel(errCause)
		assert.ErrorIs(t, child.Err(), context.Canceled)
		assert.ErrorIs(t, context.Cause(grandchild), errCause)
		stop2()
		stop()
	}
}

// Done called on many goroutines while Cancel runs: every call returns one
// channel, also after Cancel, closed once (a second close would panic),
// and a closed Done finds Err set.
func TestFlightContextDoneRacingCancel(t *testing.T) {
	for range 2000 {
		f := claimWith(t, context.Background())
		ctx := f.Context()
		var wg sync.WaitGroup
		dones := make([]<-chan struct{}, 4)
		for i := range dones {
			wg.Go(func() { dones[i] = ctx.Done() })
		}
		wg.Go(func() { f.Cancel(errCause) })
		wg.Wait()
		for _, d := range dones {
			<-d
			require.ErrorIs(t, ctx.Err(), context.Canceled)
		}
		for _, d := range dones {
			require.Equal(t, dones[0], d, "two Dones of one context returned two channels")
		}
		require.Equal(t, dones[0], ctx.Done(), "Done changed after Cancel")
	}
}
