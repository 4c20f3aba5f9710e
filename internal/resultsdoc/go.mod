module github.com/epcache/epcache/internal/resultsdoc

go 1.26.0

require github.com/epcache/epcache/bench v0.1.0

require (
	github.com/HdrHistogram/hdrhistogram-go v1.1.2 // indirect
	github.com/epcache/epcache v0.1.0 // indirect
	github.com/hashicorp/golang-lru/v2 v2.0.7 // indirect
	github.com/maypok86/otter/v2 v2.4.0 // indirect
	github.com/puzpuzpuz/xsync/v3 v3.5.1 // indirect
	github.com/puzpuzpuz/xsync/v4 v4.5.0 // indirect
	golang.org/x/sync v0.25.0 // indirect
)

// resultsdoc lives in epcache's repository and documents the harness beside
// it.
replace (
	github.com/epcache/epcache => ../..
	github.com/epcache/epcache/bench => ../../bench
)
