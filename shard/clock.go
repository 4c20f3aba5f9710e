package shard

// Ages: what eviction (a capacity cap) and idle removal need to know about
// a Ready value, kept in the slot's one state pointer so that a hit pays
// nothing for them.
//
// A table has one young Ready state, which [Table.Publish] stores and which
// a hit compares against, and IdleSteps+1 aged ones, whose [State.Status]
// is Ready too:
//
//	young ──Cool (the clock hand)──▶ cooled
//	young, cooled ──Age──▶ idle 1 ──Age──▶ … ──Age──▶ idle IdleSteps ──Age──▶ expired
//	any aged ──Touch (a use)──▶ young
//
// A hit on an aged value misses the one comparison of the hit path and
// takes the slow path once, whose Touch makes it young again by CAS: the
// reference bit of CLOCK, written only when clear, so that a hit never
// writes shared memory while its value is young. Every transition is a CAS
// on the state, so a use racing an eviction or an idle removal either
// makes the value young first (and the removal, which needs the aged state
// it saw, fails) or finds the slot Dead and looks the key up again.
//
// Cool and Age are separate steps so that the clock hand, which runs at
// the pace of misses, does not make a value look idle sooner: a cooled
// value has not been idle for any sweep.

// IdleSteps is the number of idle sweeps a value must stay unused through
// before [Table.Age] reports it expired; a sweep every IdleTimeout/IdleSteps
// removes a value between IdleTimeout and (1+1/IdleSteps)·IdleTimeout after
// its last use.
const IdleSteps = 4

// newAged returns the aged Ready states of a table: aged[0] is cooled,
// aged[i] is idle for i sweeps.
func newAged[V any]() (aged [IdleSteps + 1]*State[V]) {
	for i := range aged {
		aged[i] = &State[V]{age: uint8(i + 1)}
	}
	return aged
}

// isValue reports whether st is one of the table's Ready states, young or
// aged.
func isValue[V any](st *State[V]) bool { return st != nil && st.flight == nil }

// InvalidateState removes s from the table, as Invalidate does, only if s
// still holds st, a Ready state (young or aged) the caller observed, and
// no lease holds its value: eviction and idle removal, which a use of the
// value in between (Touch) or a lease must stop. ok reports whether it
// removed s; the caller then owns v (and calls Abandon, as after
// Invalidate).
//
// A lease and a removal can race: the lease takes a ticket, then checks
// the state; the removal marks the state (evicting), then checks the
// tickets. Whichever checks second sees the other: a removal that sees a
// lease puts the state back and fails; a lease that sees the mark (or
// Dead) is not a lease of a value in the table ([Table.Holds]): its taker
// ends it and looks again. So a value a lease holds is never removed by
// InvalidateState, and a lease of a removed value is never handed out.
func (t *Table[K, V]) InvalidateState(s *Slot[K, V], st *State[V]) (v V, ok bool) {
	if !isValue(st) || st == t.evicting {
		return v, false
	}
	// Hashed before the slot changes, as in Invalidate.
	h := t.Hash(s.key)
	if !s.state.CompareAndSwap(st, t.evicting) {
		return v, false
	}
	if s.LeaseHeld() {
		s.state.CompareAndSwap(t.evicting, st) // unless a use came meanwhile
		return v, false
	}
	// A use (Touch) or an Invalidate may take the slot out of evicting
	// first: then it is theirs.
	if !t.kill(s, t.evicting, h) {
		return v, false
	}
	return s.value, true
}

// Holds reports whether s's value is in the table now: what the taker of a
// lease checks after taking it (see InvalidateState). A lease of a value
// that is not must be ended at once.
func (t *Table[K, V]) Holds(s *Slot[K, V]) bool {
	st := s.state.Load()
	return isValue(st) && st != t.evicting
}

// Touch records a use of s's value, which the caller found in state st: an
// aged value becomes young. It reports whether s still holds its value
// (false: the slot changed first; load its state again).
func (t *Table[K, V]) Touch(s *Slot[K, V], st *State[V]) bool {
	if st == t.ready {
		return true
	}
	return isValue(st) && s.state.CompareAndSwap(st, t.ready)
}

// Young reports whether st is the young Ready state: a value used since the
// clock hand and the idle sweep last passed it.
func (t *Table[K, V]) Young(st *State[V]) bool { return st == t.ready }

// Cool is the clock hand's step on s, found in state st: a young value is
// cooled (its use is forgotten) and Cool reports false, keep it; an aged
// value, unused since the hand or a sweep last passed, gives true: a
// candidate for eviction. Any other state gives false.
func (t *Table[K, V]) Cool(s *Slot[K, V], st *State[V]) (unused bool) {
	if st == t.ready {
		s.state.CompareAndSwap(st, t.aged[0])
		return false
	}
	return isValue(st)
}

// Age is the idle sweep's step on s, found in state st: a Ready value
// unused for IdleSteps sweeps is expired (the caller removes it with
// [Table.InvalidateState]); any other is aged one step. It reports whether
// s is expired.
func (t *Table[K, V]) Age(s *Slot[K, V], st *State[V]) (expired bool) {
	switch {
	case !isValue(st) || st == t.evicting:
		return false
	case st.age > IdleSteps:
		return true
	case st == t.ready:
		s.state.CompareAndSwap(st, t.aged[1])
	default: // cooled (age 1) or idle for age-1 sweeps
		s.state.CompareAndSwap(st, t.aged[st.age])
	}
	return false
}
