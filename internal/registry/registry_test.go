package registry

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
)

var (
	errBad   = errors.New("bad name")
	errTaken = errors.New("name taken")
	errAdded = errors.New("already added")
	errs     = Errors{BadName: errBad, NameTaken: errTaken, AlreadyAdded: errAdded}
)

func TestAddRemoveAll(t *testing.T) {
	var r Registry[int] // the zero value is ready
	if got := r.All(); len(got) != 0 {
		t.Fatalf("empty registry: %v", got)
	}
	a, b := new(int), new(int)
	for _, c := range []struct {
		name  string
		owner any
		want  error
	}{
		{"b", a, nil},
		{"a", nil, nil},
		{"c", nil, nil},
		{"", nil, errBad},
		{"\xff", nil, errBad},
		{"b", b, errTaken},
		{"d", a, errAdded},
	} {
		if err := r.Add(c.name, c.owner, len(c.name), errs); !errors.Is(err, c.want) {
			t.Errorf("Add(%q): %v; want %v", c.name, err, c.want)
		}
	}
	if got := r.All(); !slices.Equal(got, []int{1, 1, 1}) {
		t.Errorf("All: %v", got)
	}
	if !r.Remove("b") || r.Remove("b") || r.Remove("zz") {
		t.Error("Remove reports a name once, and only a registered one")
	}
	// The owner is free again, under another name.
	if err := r.Add("dd", a, 2, errs); err != nil {
		t.Errorf("Add after Remove of the owner's name: %v", err)
	}
	if got := r.All(); !slices.Equal(got, []int{1, 1, 2}) {
		t.Errorf("All, in name order a, c, dd: %v", got)
	}
}

// Adds, Removes and listings from many goroutines: under the race
// detector, and every name ends registered once.
func TestConcurrentUse(t *testing.T) {
	var r Registry[string]
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				name := fmt.Sprintf("%d/%d", g, i)
				if err := r.Add(name, name, name, errs); err != nil {
					t.Error(err)
				}
				if i%2 == 1 && !r.Remove(name) {
					t.Errorf("Remove(%q) found nothing", name)
				}
				_ = r.All()
			}
		})
	}
	wg.Wait()
	if got := len(r.All()); got != 8*100 {
		t.Errorf("%d sources; want 800", got)
	}
}
