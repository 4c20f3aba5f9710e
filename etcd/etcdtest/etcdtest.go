// Package etcdtest starts an embedded etcd server on loopback, on free
// ports, in a directory of its own: for tests, and for epmesh when it is
// not given a cluster. It starts in well under a second.
package etcdtest

import (
	"fmt"
	"net/url"
	"os"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

// Server is a running embedded etcd.
type Server struct {
	etcd *embed.Etcd
	dir  string
	url  string
}

// Start starts a single-member etcd on 127.0.0.1 with free ports, its data
// in a fresh temporary directory (dataDir, if not empty, to restart a
// server on the data of one that stopped).
func Start(dataDir string) (*Server, error) {
	return start(dataDir, "http://127.0.0.1:0")
}

// Restart starts a server on the data directory and client URL of s, which
// must have been stopped with Stop: the same cluster back, as after a crash
// and a restart of etcd.
func (s *Server) Restart() (*Server, error) { return start(s.dir, s.url) }

// readyLimit only detects a server that will never be ready: a busy
// machine may take many times the usual second.
const readyLimit = 2 * time.Minute

func start(dataDir, clientURL string) (*Server, error) {
	dir := dataDir
	if dir == "" {
		d, err := os.MkdirTemp("", "etcdtest-")
		if err != nil {
			return nil, err
		}
		dir = d
	}
	cu, err := url.Parse(clientURL)
	if err != nil {
		return nil, err
	}
	pu, _ := url.Parse("http://127.0.0.1:0")
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.Name + "=" + pu.String()
	if dataDir != "" {
		cfg.ClusterState = embed.ClusterStateFlagExisting
	}
	cfg.LogLevel = "fatal"
	// Every write waits for etcd's WAL sync, and etcd fails a write whose
	// raft round takes more than its request timeout (7 s here): a disk
	// stalled by other work would fail a test. The data dies with the
	// process's directory anyway, and Stop closes the files, so Restart
	// still finds everything.
	cfg.UnsafeNoFsync = true
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		if dataDir == "" {
			os.RemoveAll(dir)
		}
		return nil, fmt.Errorf("etcdtest: start etcd: %w", err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(readyLimit):
		e.Close()
		return nil, fmt.Errorf("etcdtest: etcd did not become ready within %v", readyLimit)
	}
	return &Server{etcd: e, dir: dir, url: "http://" + e.Clients[0].Addr().String()}, nil
}

// URL returns the client URL, "http://127.0.0.1:port".
func (s *Server) URL() string { return s.url }

// Stop stops the server and keeps its data, for Restart.
func (s *Server) Stop() {
	s.etcd.Close()
	<-s.etcd.Server.StopNotify()
}

// Close stops the server and removes its data.
func (s *Server) Close() {
	s.Stop()
	os.RemoveAll(s.dir)
}
