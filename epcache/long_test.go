package epcache_test

import "flag"

// long selects the long versions of the campaign tests: the linearizability
// campaign, the one-million-peer scale test at full size under the race
// detector too. `make stress` sets it; CI runs the short versions.
var long = flag.Bool("long", false, "run the long versions of the campaign tests (make stress)")
