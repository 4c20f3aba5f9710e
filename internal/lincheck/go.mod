module github.com/epcache/epcache/internal/lincheck

go 1.26.0

require (
	github.com/anishathalye/porcupine v1.3.1
	github.com/epcache/epcache v0.1.0
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect

replace github.com/epcache/epcache => ../..
