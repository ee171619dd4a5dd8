// Command nodekit runs a local Kubernetes cluster made of nodekit's agents and explains
// what it sees on a node or a Service in plain words.
//
//	nodekit up [--nodes N] [--state-dir DIR] [--detach]   start a cluster
//	nodekit up --host-network [--node-ip IP]               make this machine its one node
//	nodekit down [--state-dir DIR]                         stop it, leaving nothing behind
//	nodekit status [--state-dir DIR]                       say what runs
//	nodekit load IMAGE.tar [--state-dir DIR]               import an image into every node
//	nodekit restart PART [--node NODE]                     restart a part (kubelet, kube-proxy, ...)
//	nodekit explain node NAME                              why a node is (not) Ready
//	nodekit explain service NS/NAME                        why a Service does (not) answer
//
// See docs/up.md and docs/explain.md.
package main

import (
	"errors"
	"fmt"
	"os"
)

// Exit statuses: 0 success (or healthy), 1 an explained failure (explain found a
// problem), 2 bad usage or an error running the command.
const (
	exitOK        = 0
	exitUnhealthy = 1
	exitError     = 2
)

// errUsage marks an error in the command line.
var errUsage = errors.New("usage")

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) == 0 {
		usage()
		return exitError
	}
	var code int
	var err error
	switch args[0] {
	case "explain":
		code, err = runExplain(args[1:])
	case "up":
		code, err = runUp(args[1:])
	case "down":
		code, err = runDown(args[1:])
	case "status":
		code, err = runStatus(args[1:])
	case "load":
		code, err = runLoad(args[1:])
	case "restart":
		code, err = runRestart(args[1:])
	case "supervise":
		// Internal: the detached supervisor `up --detach` leaves running.
		code, err = runSupervise(args[1:])
	case "-h", "--help", "help":
		usage()
		return exitOK
	default:
		fmt.Fprintf(os.Stderr, "nodekit: unknown command %q\n", args[0])
		usage()
		return exitError
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "nodekit %s: %v\n", args[0], err)
		if errors.Is(err, errUsage) {
			return exitError
		}
		if code == exitOK {
			code = exitError
		}
	}
	return code
}

func usage() {
	fmt.Fprint(os.Stderr, `usage: nodekit COMMAND [flags]

commands:
  up        start a local cluster (etcd, control plane, N nodes with containerd, kubelet, kube-proxy)
  down      stop the cluster and remove everything it made
  status    report each part of the cluster
  load      import an image tarball into every node's containerd
  restart   restart one part (restart kubelet --node node-1)
  explain   explain a node (explain node NAME) or a Service (explain service NS/NAME)

Run "nodekit COMMAND -h" for the flags of a command.
`)
}
