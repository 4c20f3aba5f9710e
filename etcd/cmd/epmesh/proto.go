package main

import (
	"encoding/json"
	"time"

	"github.com/epcache/epcache/bench"
	"github.com/epcache/epcache/etcd/etcddir"
	"github.com/epcache/epcache/transport/tcp"
)

// The parent and a child talk over the child's stdin and stdout, one JSON
// object per line: the parent writes requests, the child answers each with
// a reply carrying the request's ID. The child runs every request on a
// goroutine of its own, so that the parent can have a child hammer a peer
// and watch the directory at once; replies come in the order requests end.
// The child's stderr is the parent's, for diagnostics only.

// childEnv, set to "1" in a process's environment, makes the binary a child:
// it runs the line protocol on stdin and stdout instead of parsing flags.
// The test binary re-executes itself the same way.
const childEnv = "EPMESH_CHILD"

// Operations of the line protocol.
const (
	opInit      = "init"      // connect to etcd and open the directory (initArgs)
	opListen    = "listen"    // start the tcp.Peer, publish its address (listenReply)
	opSync      = "sync"      // wait until every peer's address is visible in Dir
	opSend      = "send"      // M messages to each of To, G goroutines (sendReply)
	opAwait     = "await"     // wait for M messages of Phase from each of To (awaitReply)
	opStats     = "stats"     // counters, sockets, descriptors (statsReply)
	opHammer    = "hammer"    // send to Peer from G goroutines until Dur after the first failure (hammerReply)
	opWithdrawn = "withdrawn" // wait until Lookup(Peer) says withdrawn (withdrawnReply)
	opProbe     = "probe"     // send to Peer until one Send succeeds (probeReply)
	opClose     = "close"     // close the tcp.Peer, count descriptors (closeReply)
	opRawListen = "rawlisten" // the storm's raw listener, published under raw/ (listenReply)
	opStorm     = "storm"     // one connection storm through a comparator (stormReply)
	opFDs       = "fds"       // count the open descriptors now (settleReply)
	opSettle    = "settle"    // wait until Accepted connections came in and the descriptors are back to FDs (settleReply)
)

// Directories of a child, for opSync.
const (
	dirTCP = "tcp" // tcp.Peer addresses: Prefix + "tcp/"
	dirRaw = "raw" // the storm's raw listeners: Prefix + "raw/"
)

// request is one command of the parent's.
type request struct {
	ID   int       `json:"id"`
	Op   string    `json:"op"`
	Init *initArgs `json:"init,omitempty"`

	Phase       int           `json:"phase,omitempty"`   // tags the messages of one round
	To          []int         `json:"to,omitempty"`      // the peers to send to, or to await messages from
	Peer        int           `json:"peer,omitempty"`    // the peer of hammer, withdrawn, probe
	M           int           `json:"m,omitempty"`       // messages per peer
	G           int           `json:"g,omitempty"`       // goroutines
	Dur         time.Duration `json:"dur,omitempty"`     // how long to hammer
	Timeout     time.Duration `json:"timeout,omitempty"` // a bound on the whole operation
	SendTimeout time.Duration `json:"send_timeout,omitempty"`
	Dir         string        `json:"dir,omitempty"`
	Impl        string        `json:"impl,omitempty"`
	RTT         time.Duration `json:"rtt,omitempty"`
	FDs         int           `json:"fds,omitempty"`
	Accepted    int64         `json:"accepted,omitempty"` // settle: the raw connections accepted so far, all runs
}

// initArgs configures a child.
type initArgs struct {
	Endpoints []string      `json:"endpoints"` // etcd client URLs
	Prefix    string        `json:"prefix"`    // this run's keys: Prefix + "tcp/" + id, Prefix + "raw/" + id
	ID        int           `json:"id"`
	N         int           `json:"n"`
	TTL       time.Duration `json:"ttl"`       // etcddir lease TTL
	ErrorTTL  time.Duration `json:"error_ttl"` // tcp.Config.ErrorTTL
	// StepTimeout is etcddir's Options.Timeout and tcp's CreateTimeout and
	// HandshakeTimeout; 0: their defaults.
	StepTimeout time.Duration `json:"step_timeout,omitempty"`
	// DirMode is etcddir's mode: "mirror" or "ondemand".
	DirMode string `json:"dir_mode"`
}

// reply answers a request; Data is the operation's reply, Err says why it
// failed.
type reply struct {
	ID   int             `json:"id"`
	Err  string          `json:"err,omitempty"`
	Data json.RawMessage `json:"data,omitempty"`
}

type initReply struct {
	PID int `json:"pid"`
	// Forget reports that the child can make its tcp.Peer forget a
	// remembered failure when the directory's watch says a peer is back.
	Forget bool `json:"forget"`
}

type listenReply struct {
	Addr string `json:"addr"`
	FDs  int    `json:"fds"` // open descriptors just before the listener was made
	At   int64  `json:"at"`  // Unix ns: the address was published
}

type sendReply struct {
	Sent     int64         `json:"sent"`
	Errors   int64         `json:"errors"`
	FirstErr string        `json:"first_err,omitempty"`
	Elapsed  time.Duration `json:"elapsed"`
	// Complete is how long after the request arrived every peer of To had
	// taken a message: the child held a connection to each. -1 if some
	// peer never did.
	Complete time.Duration `json:"complete"`
}

type awaitReply struct {
	Received   map[int]int `json:"received"` // messages of the phase, by sender
	Duplicates int         `json:"duplicates"`
	Complete   bool        `json:"complete"`
}

type statsReply struct {
	Stats tcp.Stats `json:"stats"`
	// Dir is the counters of the child's directory of tcp.Peer addresses.
	Dir       etcddir.Counters `json:"dir"`
	Sockets   []socket         `json:"sockets"`
	SocketsOK bool             `json:"sockets_ok"` // /proc listed them
	FDs       int              `json:"fds"`
}

type hammerReply struct {
	Sends, OK, Failed int64
	// Elapsed is how long the hammer ran.
	Elapsed time.Duration
	// Hung counts Sends that ended only because their SendTimeout did.
	Hung int64
	// MaxFailed is the longest a failed Send took.
	MaxFailed    time.Duration
	FirstFailure int64            // Unix ns of the first failed Send; 0 if none
	LastErr      string           `json:",omitempty"`
	Kinds        map[string]int64 // failures by kind of error
	DialAttempts uint64           // tcp.Stats.DialAttempts during the run
	ErrorHits    uint64           // epcache.Stats.ErrorHits during the run: Sends the remembered failure answered
	// News counts the new addresses of Peer the directory's watch told of
	// during the run: each makes tcp.Peer forget a remembered failure.
	News int64
}

type withdrawnReply struct {
	Seen bool   `json:"seen"`
	At   int64  `json:"at"` // Unix ns
	Err  string `json:"err,omitempty"`
}

type probeReply struct {
	OK       bool   `json:"ok"`
	Attempts int    `json:"attempts"`
	At       int64  `json:"at"` // Unix ns of the Send that succeeded
	LastErr  string `json:"last_err,omitempty"`
	// WatchAt is when the directory's watch last told of a new address
	// for the peer (Unix ns; 0: never).
	WatchAt int64 `json:"watch_at"`
	Forget  bool  `json:"forget"`
}

type closeReply struct {
	Stats tcp.Stats `json:"stats"`
	FDs   int       `json:"fds"` // open descriptors once the peer is closed
}

type stormReply struct {
	Elapsed  time.Duration `json:"elapsed"` // until every goroutine had every peer's endpoint
	Errors   int64         `json:"errors"`
	FirstErr string        `json:"first_err,omitempty"`
	Counts   bench.Counts  `json:"counts"`
	DialedTo []int64       `json:"dialed_to"` // by peer: connections dialed to it in this run
}

type settleReply struct {
	FDs      int   `json:"fds"`
	Accepted int64 `json:"accepted"`
}
