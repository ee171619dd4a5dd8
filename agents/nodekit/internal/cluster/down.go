package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// stopGrace is how long a process gets between SIGTERM and SIGKILL.
const stopGrace = 10 * time.Second

// Down removes exactly what the state file in stateDir records: the processes (by PID
// and start time), the pod sandboxes through CRI (so CNI releases their addresses),
// the runtime's shims and mounts under the state dir, with --host-network what the
// node made in the machine's namespace (State.Host), the network namespaces, and
// the files `up` wrote. Nothing else is touched. It goes on past errors and returns
// them all.
func Down(ctx context.Context, stateDir string, log io.Writer) error {
	if log == nil {
		log = io.Discard
	}
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		return err
	}
	st, err := LoadState(abs)
	if err != nil {
		return err
	}
	logf := func(format string, args ...any) { fmt.Fprintf(log, "nodekit down: "+format+"\n", args...) }
	var errs []error
	for i := len(st.Processes) - 1; i >= 0; i-- {
		p := st.Processes[i]
		if p.Name == "containerd" {
			if p.Alive() {
				if n := st.node(p.Node); n != nil {
					if err := removeSandboxes(ctx, n.Runtime); err != nil {
						errs = append(errs, fmt.Errorf("node %s: %w", p.Node, err))
					}
				}
			}
			stop(p, stopGrace)
			if n := st.node(p.Node); n != nil {
				for _, pid := range shimsOf(strings.TrimPrefix(n.Runtime, "unix://")) {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		} else {
			stop(p, stopGrace)
		}
		if p.Alive() {
			errs = append(errs, fmt.Errorf("%s (pid %d) is still running", p.Name, p.PID))
		}
		logf("stopped %s %s", p.Name, p.Node)
	}
	// Shims end a moment after SIGKILL; their mounts are released then.
	for _, n := range st.Nodes {
		for range 50 {
			if len(shimsOf(strings.TrimPrefix(n.Runtime, "unix://"))) == 0 {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	if err := unmountAll(abs); err != nil {
		errs = append(errs, err)
	}
	// --host-network: what the node's plugins made in the machine's namespace, once
	// nothing of the cluster runs that would make it again.
	if err := undoHost(ctx, st.Host, logf); err != nil {
		errs = append(errs, err)
	}
	for _, n := range st.Nodes {
		if n.CgroupRoot == "" {
			continue
		}
		if err := removeCgroupRoot(n.CgroupRoot); err != nil {
			errs = append(errs, err)
		} else {
			logf("removed cgroup %s", n.CgroupRoot)
		}
	}
	for i := len(st.Namespaces) - 1; i >= 0; i-- {
		ns := st.Namespaces[i]
		if _, err := os.Stat(nsPath(ns)); errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err := ip(ctx, "netns", "delete", ns); err != nil {
			errs = append(errs, err)
		} else {
			logf("deleted network namespace %s", ns)
		}
	}
	if len(errs) > 0 {
		// Keep the state file: a second `down` retries what is left.
		return errors.Join(errs...)
	}
	for _, p := range []string{"pki", "cp", "nodes", "logs", "mirror", "kubeconfig", StateFile} {
		if err := os.RemoveAll(filepath.Join(abs, p)); err != nil {
			errs = append(errs, err)
		}
	}
	// The state dir itself goes when nothing else is in it.
	_ = os.Remove(abs)
	return errors.Join(errs...)
}

func (st *State) node(name string) *Node {
	for i := range st.Nodes {
		if st.Nodes[i].Name == name {
			return &st.Nodes[i]
		}
	}
	return nil
}

// removeSandboxes stops and removes every pod sandbox, so CNI DEL runs for each. A
// sandbox whose container is still being started (the kubelet was stopped in the
// middle of a StartContainer) cannot be removed until containerd finishes that start,
// so the ones that fail are tried again every 200ms for up to 15s.
func removeSandboxes(ctx context.Context, endpoint string) error {
	conn, err := grpc.NewClient(endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	rs := runtimeapi.NewRuntimeServiceClient(conn)
	resp, err := rs.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{})
	if err != nil {
		return fmt.Errorf("list sandboxes: %w", err)
	}
	left := resp.GetItems()
	retryUntil := time.Now().Add(15 * time.Second)
	for {
		var errs []error
		var failed []*runtimeapi.PodSandbox
		for _, s := range left {
			if _, err := rs.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: s.GetId()}); err != nil {
				errs = append(errs, fmt.Errorf("stop sandbox %s: %w", s.GetMetadata().GetName(), err))
				failed = append(failed, s)
				continue
			}
			if _, err := rs.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: s.GetId()}); err != nil {
				errs = append(errs, fmt.Errorf("remove sandbox %s: %w", s.GetMetadata().GetName(), err))
				failed = append(failed, s)
			}
		}
		if len(failed) == 0 || time.Now().After(retryUntil) {
			return errors.Join(errs...)
		}
		select {
		case <-ctx.Done():
			return errors.Join(append(errs, ctx.Err())...)
		case <-time.After(200 * time.Millisecond):
		}
		left = failed
	}
}
