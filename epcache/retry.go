package epcache

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Backoff returns a [Config.Retry] policy of capped exponential backoff with
// jitter. attempts is the total number of attempts allowed (1 means no
// retry; 0 means no limit, so that only CreateTimeout or Close ends the
// retries). After the n-th failed attempt it waits a random duration in
// [d/2, d], where d = min(max, base·2^(n-1)): the lower half keeps the
// backoff growing, the random upper half keeps a crowd of creators (every
// rank reconnecting to one restarted peer) from retrying in lockstep.
// retryable, if set, decides which errors are worth another attempt; nil
// retries every error.
//
// Backoff panics if base is not positive, max is less than base, or
// attempts is negative: these are programming errors, found at startup.
func Backoff(base, max time.Duration, attempts int, retryable func(error) bool) func(int, error) (time.Duration, bool) {
	switch {
	case base <= 0:
		panic(fmt.Sprintf("epcache: Backoff base is %v; want a positive duration", base))
	case max < base:
		panic(fmt.Sprintf("epcache: Backoff max %v is less than base %v", max, base))
	case attempts < 0:
		panic(fmt.Sprintf("epcache: Backoff attempts is %d; want 0 (unlimited) or a positive count", attempts))
	}
	return func(attempt int, err error) (time.Duration, bool) {
		if (attempts > 0 && attempt >= attempts) || (retryable != nil && !retryable(err)) {
			return 0, false
		}
		d := base
		for i := 1; i < attempt && d < max; i++ {
			if d > max/2 {
				d = max // doubling would pass the cap (or overflow)
			} else {
				d *= 2
			}
		}
		half := d / 2
		return half + rand.N(d-half+1), true
	}
}
