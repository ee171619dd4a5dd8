package main

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/vishvananda/netns"
)

var errNetns = errors.New("network namespace")

// nsRunner runs functions on one OS thread that sits in the node's network
// namespace, so the rules writers' netlink sockets and child processes (nft,
// iptables-restore) live there while the rest of the process, the API client
// included, stays in its own namespace. The thread is never returned to the Go
// scheduler: when the runner stops, the thread exits with its goroutine.
type nsRunner struct {
	reqs chan nsReq
	done chan struct{}
}

type nsReq struct {
	fn  func() error
	out chan error
}

// startNSRunner switches a dedicated thread into the namespace at path.
func startNSRunner(path string) (*nsRunner, error) {
	r := &nsRunner{reqs: make(chan nsReq), done: make(chan struct{})}
	ready := make(chan error, 1)
	go func() {
		defer close(r.done)
		// Never unlocked: the thread's namespace differs from the process's, so it
		// must die with this goroutine rather than run other goroutines.
		runtime.LockOSThread()
		h, err := netns.GetFromPath(path)
		if err != nil {
			ready <- fmt.Errorf("%w %s: %w", errNetns, path, err)
			return
		}
		err = netns.Set(h)
		_ = h.Close()
		if err != nil {
			ready <- fmt.Errorf("%w %s: entering: %w", errNetns, path, err)
			return
		}
		ready <- nil
		for req := range r.reqs {
			req.out <- req.fn()
		}
	}()
	if err := <-ready; err != nil {
		<-r.done
		return nil, err
	}
	return r, nil
}

// Do runs fn on the namespace's thread and returns its error. fn must not rely
// on goroutines it starts being in the namespace.
func (r *nsRunner) Do(fn func() error) error {
	out := make(chan error, 1)
	r.reqs <- nsReq{fn: fn, out: out}
	return <-out
}

// Close stops the runner; its thread exits.
func (r *nsRunner) Close() {
	close(r.reqs)
	<-r.done
}
