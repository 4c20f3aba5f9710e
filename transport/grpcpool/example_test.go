package grpcpool_test

import (
	"context"
	"fmt"
	"net"

	"github.com/epcache/epcache/transport/grpcpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func Example() {
	// A gRPC server on loopback with the standard health service.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(ln)
	defer srv.Stop()
	addr := ln.Addr().String()

	pool, err := grpcpool.New(grpcpool.Config{
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())},
		MaxConns:    64,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pool.Close()
	pool.SetMembers([]string{addr})

	// Do dials addr once (waiting for Ready), then holds the connection
	// for the call: nothing the pool does closes it under the call.
	for range 3 {
		err := pool.Do(context.Background(), addr, func(ctx context.Context, cc grpc.ClientConnInterface) error {
			resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
			if err != nil {
				return err // a broken connection is dropped; the next Do dials again
			}
			fmt.Println(resp.GetStatus())
			return nil
		})
		if err != nil {
			fmt.Println(err)
			return
		}
	}
	st := pool.Stats()
	fmt.Println("dials:", st.Dials, "calls:", st.Calls)
	// Output:
	// SERVING
	// SERVING
	// SERVING
	// dials: 1 calls: 3
}
