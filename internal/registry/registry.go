// Package registry is the set of named sources that epcache's exporters
// (observe/debugpage, observe/prometheus, observe/otel) keep: each name
// non-empty UTF-8 and registered once, each owner (a cache, a tcp peer)
// under one name at most, listed in name order. Its zero value is empty
// and ready; it is safe for concurrent use.
package registry

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"unicode/utf8"
)

// Errors are the errors an exporter returns, each its own package's, so
// that its callers test for them with errors.Is against that package.
type Errors struct {
	// BadName: an empty name, or one that is not UTF-8.
	BadName error
	// NameTaken: another source has the name.
	NameTaken error
	// AlreadyAdded: the owner is registered under another name.
	AlreadyAdded error
}

// Registry holds sources of type S by name.
type Registry[S any] struct {
	mu     sync.Mutex
	byName map[string]entry[S]
	owners map[any]string // each owner → its name
}

type entry[S any] struct {
	owner any
	s     S
}

// Add registers s under name. owner, if not nil, is what s reports on
// (compared with ==): an owner registered already is refused, so that one
// cache is not counted twice under two names.
func (r *Registry[S]) Add(name string, owner any, s S, errs Errors) error {
	if name == "" || !utf8.ValidString(name) {
		return fmt.Errorf("%w; got %q", errs.BadName, name)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, taken := r.byName[name]; taken {
		return fmt.Errorf("%w: %q", errs.NameTaken, name)
	}
	if owner != nil {
		if other, ok := r.owners[owner]; ok {
			return fmt.Errorf("%w as %q; not added as %q", errs.AlreadyAdded, other, name)
		}
		if r.owners == nil {
			r.owners = map[any]string{}
		}
		r.owners[owner] = name
	}
	if r.byName == nil {
		r.byName = map[string]entry[S]{}
	}
	r.byName[name] = entry[S]{owner, s}
	return nil
}

// Remove unregisters the source called name, reporting whether there was
// one.
func (r *Registry[S]) Remove(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.byName[name]
	if !ok {
		return false
	}
	delete(r.byName, name)
	if e.owner != nil {
		delete(r.owners, e.owner)
	}
	return true
}

// All returns the sources in name order: a copy, which later Adds and
// Removes leave alone.
func (r *Registry[S]) All() []S {
	r.mu.Lock()
	names := make([]string, 0, len(r.byName))
	for n := range r.byName {
		names = append(names, n)
	}
	slices.SortFunc(names, strings.Compare)
	all := make([]S, len(names))
	for i, n := range names {
		all[i] = r.byName[n].s
	}
	r.mu.Unlock()
	return all
}
