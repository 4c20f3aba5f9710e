// Package flaglist is the comma-separated list flag of the project's
// commands (cmd/epbench, and etcd/cmd/epmesh in the etcd module, which may
// import it: Go's internal rule goes by import path) and the parsers they
// share.
package flaglist

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// List is a flag.Value of comma-separated values of T: Vals holds the
// default until the flag is given, then what was given (Given is set).
type List[T any] struct {
	Vals  []T
	Given bool
	Parse func(string) (T, error)
}

func (l *List[T]) String() string {
	parts := make([]string, len(l.Vals))
	for i, v := range l.Vals {
		parts[i] = fmt.Sprint(v)
	}
	return strings.Join(parts, ",")
}

// Set parses s, replacing the default; an element Parse rejects fails it.
func (l *List[T]) Set(s string) error {
	var vals []T
	for part := range strings.SplitSeq(s, ",") {
		v, err := l.Parse(strings.TrimSpace(part))
		if err != nil {
			return err
		}
		vals = append(vals, v)
	}
	l.Vals, l.Given = vals, true
	return nil
}

// OneOf accepts the allowed strings of flag name.
func OneOf(name string, allowed ...string) func(string) (string, error) {
	return func(s string) (string, error) {
		if !slices.Contains(allowed, s) {
			return "", fmt.Errorf("%s %q: want one of %s", name, s, strings.Join(allowed, ", "))
		}
		return s, nil
	}
}

// IntAtLeast accepts integers of at least least.
func IntAtLeast(name string, least int) func(string) (int, error) {
	return func(s string) (int, error) {
		n, err := strconv.Atoi(s)
		if err != nil || n < least {
			return 0, fmt.Errorf("%s %q: want an integer of at least %d", name, s, least)
		}
		return n, nil
	}
}

// NonNegativeDuration accepts Go durations of 0 or more.
func NonNegativeDuration(name string) func(string) (time.Duration, error) {
	return func(s string) (time.Duration, error) {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			return 0, fmt.Errorf("%s %q: want a Go duration of 0 or more, such as 5ms", name, s)
		}
		return d, nil
	}
}
