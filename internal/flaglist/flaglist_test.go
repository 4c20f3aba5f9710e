package flaglist

import (
	"testing"
	"time"
)

func TestList(t *testing.T) {
	l := &List[int]{Vals: []int{8}, Parse: IntAtLeast("-n", 2)}
	if l.String() != "8" || l.Given {
		t.Fatalf("default: %q, given %v", l.String(), l.Given)
	}
	if err := l.Set("4, 16"); err != nil || l.String() != "4,16" || !l.Given {
		t.Fatalf("Set(4, 16): %v, %q", err, l.String())
	}
	if err := l.Set("4,1"); err == nil || err.Error() != `-n "1": want an integer of at least 2` {
		t.Fatalf("Set(4,1): %v", err)
	}
	if _, err := OneOf("-x", "a", "b")("c"); err == nil || err.Error() != `-x "c": want one of a, b` {
		t.Fatalf("OneOf: %v", err)
	}
	if d, err := NonNegativeDuration("-rtt")("5ms"); err != nil || d != 5*time.Millisecond {
		t.Fatalf("NonNegativeDuration(5ms): %v, %v", d, err)
	}
	if _, err := NonNegativeDuration("-rtt")("-1s"); err == nil {
		t.Fatal("NonNegativeDuration(-1s) succeeded")
	}
}
