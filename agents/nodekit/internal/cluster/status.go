package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nodekit-dev/nodekit/agents/nodekit/internal/mirror"
)

// RecordSupervisor adds the detached supervisor to the state, so down stops it first.
func RecordSupervisor(st *State, pid int, logPath string) error {
	t, err := startTime(pid)
	if err != nil {
		return fmt.Errorf("the supervisor exited at once (see %s): %w", logPath, err)
	}
	st.Processes = append(st.Processes, Process{Name: "supervisor", PID: pid, StartTime: t, Log: logPath})
	return st.save()
}

// Supervise serves the forwarder on l, and the registry mirror on mirrorL when it is
// not nil, until ctx ends.
func Supervise(ctx context.Context, st *State, l, mirrorL net.Listener, log io.Writer) error {
	if st.HostNetwork {
		return errors.New("a host-network cluster has no forwarder: its API server listens on the machine's network")
	}
	var cp string
	for _, ns := range st.Namespaces {
		if strings.HasSuffix(ns, "-cp") {
			cp = ns
		}
	}
	if cp == "" {
		return errors.New("the state records no control-plane namespace")
	}
	d, err := NewNSDialer(nsPath(cp))
	if err != nil {
		return err
	}
	defer d.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	mirrored := make(chan error, 1)
	go func() {
		if mirrorL == nil {
			mirrored <- nil
			return
		}
		err := ServeMirror(ctx, st.StateDir, mirrorL, log)
		if err != nil {
			// The forwarder goes on: kubectl keeps working without the mirror.
			fmt.Fprintf(log, "registry mirror stopped: %v\n", err)
		}
		mirrored <- err
	}()
	err = Forward(ctx, l, d, net.JoinHostPort(st.ControlPlaneIP, strconv.Itoa(APIServerPort)))
	cancel()
	return errors.Join(err, <-mirrored)
}

// Part is one line of `nodekit status`.
type Part struct {
	Name, Node, PID, State, Detail string
}

// Report is the whole status.
type Report struct {
	Parts   []Part
	Healthy bool
}

// Status checks every recorded process, the API server through the forwarder, and
// each node's runtime.
func Status(ctx context.Context, st *State) Report {
	rep := Report{Healthy: true}
	for _, p := range st.Processes {
		part := Part{Name: p.Name, Node: p.Node, PID: strconv.Itoa(p.PID), State: "running", Detail: p.Log}
		if !p.Alive() {
			part.State, rep.Healthy = "NOT RUNNING", false
		}
		rep.Parts = append(rep.Parts, part)
	}
	api := Part{Name: "api-server", State: "ready", Detail: "https://127.0.0.1:" + strconv.Itoa(st.APIPort) + "/readyz ok"}
	if st.HostNetwork {
		api.Detail += " (listening on the machine's network, advertised as " + st.ControlPlaneIP + ")"
	}
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	if err := ReadyzThroughForwarder(actx, filepath.Join(st.StateDir, "kubeconfig")); err != nil {
		api.State, api.Detail, rep.Healthy = "NOT READY", err.Error(), false
	}
	cancel()
	rep.Parts = append(rep.Parts, api)
	if st.Mirror != "" {
		part := Part{Name: "mirror", State: "ready", Detail: "http://" + st.Mirror + "/v2/ ok (" + MirrorListFile(st.StateDir) + ")"}
		mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := mirrorAnswers(mctx, st); err != nil {
			part.State, part.Detail, rep.Healthy = "NOT READY", err.Error(), false
		}
		cancel()
		rep.Parts = append(rep.Parts, part)
	}
	for _, n := range st.Nodes {
		part := Part{Name: "cri", Node: n.Name, State: "ready", Detail: n.Runtime + " (" + n.Where() + ", " + n.IP + ", pods " + n.PodCIDR + ")"}
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		if err := RuntimeReady(rctx, n.Runtime); err != nil {
			part.State, part.Detail, rep.Healthy = "NOT READY", err.Error(), false
		}
		cancel()
		rep.Parts = append(rep.Parts, part)
	}
	return rep
}

// mirrorAnswers asks the registry mirror for /v2/ from the fabric namespace, where the
// nodes reach it.
func mirrorAnswers(ctx context.Context, st *State) error {
	var fabric string
	for _, ns := range st.Namespaces {
		if strings.HasSuffix(ns, "-fabric") {
			fabric = ns
		}
	}
	if fabric == "" {
		return errors.New("the state records no fabric namespace")
	}
	d, err := NewNSDialer(nsPath(fabric))
	if err != nil {
		return err
	}
	defer d.Close()
	client := &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+st.Mirror+"/v2/", nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("registry mirror: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("registry mirror: GET /v2/ said %s", resp.Status)
	}
	return nil
}

// Load imports an image tarball (OCI layout or docker archive) into every node's
// containerd, in the k8s.io namespace the CRI plugin reads, and has the registry mirror
// serve it (an OCI layout tar; the mirror's log says why it does not serve another).
func Load(ctx context.Context, st *State, tar string) error {
	for _, n := range st.Nodes {
		if err := importImage(ctx, st, n, tar); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	if st.Mirror == "" {
		return nil
	}
	// The mirror serves it from the next pull on; its registries go to the mirror.
	regs, err := registriesOf([]string{tar})
	if err != nil {
		return err
	}
	for _, n := range st.Nodes {
		if err := writeMirrorHosts(n, st.Mirror, regs); err != nil {
			return fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	return mirror.AppendList(MirrorListFile(st.StateDir), tar)
}

// ErrNoSuchPart marks a restart of a part the state does not record.
var ErrNoSuchPart = errors.New("no such part")

// Restart stops the recorded process name (on node, "" for the control plane) if it
// still runs and starts it again with the same command line, recording its new PID.
// It is how the seed's stories heal: restart the kubelet or kube-proxy that was killed.
func Restart(st *State, name, node string) (Process, error) {
	for i, p := range st.Processes {
		if p.Name != name || p.Node != node {
			continue
		}
		if len(p.Command) == 0 {
			return Process{}, fmt.Errorf("%s cannot be restarted (no recorded command; the supervisor is restarted by nodekit up)", name)
		}
		stop(p, stopGrace)
		cmd, err := startCommand(p.Log, p.Command)
		if err != nil {
			return Process{}, err
		}
		t, err := startTime(cmd.Process.Pid)
		if err != nil {
			return Process{}, fmt.Errorf("%s exited at once (see %s): %w", name, p.Log, err)
		}
		p.PID, p.StartTime = cmd.Process.Pid, t
		st.Processes[i] = p
		return p, st.save()
	}
	where := "the control plane"
	if node != "" {
		where = "node " + node
	}
	return Process{}, fmt.Errorf("%w: %s on %s", ErrNoSuchPart, name, where)
}

// Where names the node's network namespace for people: "netns NAME", or "the
// machine's network" for a host-network node.
func (n Node) Where() string {
	if n.NetNS == "" {
		return "the machine's network"
	}
	return "netns " + n.NetNS
}

// OnNode is the command-line prefix that runs a command in the node's network
// namespace: nsenter for a namespaced node, nothing for a host-network one.
func (n Node) OnNode() string {
	if n.NetNS == "" {
		return ""
	}
	return "nsenter --net=" + nsPath(n.NetNS) + " "
}
