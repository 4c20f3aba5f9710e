package dskitbench_test

import (
	"testing"

	"github.com/epcache/epcache/transport/grpcpool/dskitbench"
)

// BenchmarkOverhead is scenario 6 for go test: compare the implementations
// with `benchstat -col /impl`, e.g.
//
//	GOWORK=off go test -run '^$' -bench Overhead -benchmem -cpu 1,2 -count 10 . > overhead.txt
func BenchmarkOverhead(b *testing.B) {
	s, err := dskitbench.StartServer(0)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Stop()
	for _, bc := range dskitbench.BenchCases {
		b.Run(bc.Name, func(b *testing.B) { bc.Run(b, s.Addr) })
	}
}
