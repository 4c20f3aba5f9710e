module github.com/epcache/epcache/bench

go 1.26.0

require (
	github.com/HdrHistogram/hdrhistogram-go v1.1.2
	github.com/epcache/epcache v0.1.0
	github.com/hashicorp/golang-lru/v2 v2.0.7
	github.com/maypok86/otter/v2 v2.4.0
	github.com/puzpuzpuz/xsync/v3 v3.5.1
	github.com/puzpuzpuz/xsync/v4 v4.5.0
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
	golang.org/x/sync v0.25.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect

// The harness lives in epcache's repository and measures the epcache beside
// it.
replace github.com/epcache/epcache => ../
