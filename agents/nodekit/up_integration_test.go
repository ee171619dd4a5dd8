package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/nodekit-dev/nodekit/agents/nodekit/internal/cluster"
	"github.com/nodekit-dev/nodekit/internal/testenv"
)

// upEnv checks what `nodekit up` needs and returns the peers and images folders.
func upEnv(t *testing.T) (peers, images, crictl string) {
	t.Helper()
	testenv.RequireRoot(t)
	testenv.RequireLong(t)
	for _, tool := range []string{"ip", "nsenter", "containerd", "runc", "ctr"} {
		testenv.LookPath(t, tool)
	}
	kubectl := testenv.PeerBinary(t, "kubectl")
	peers = filepath.Dir(kubectl)
	images = os.Getenv("NODEKIT_IMAGES_DIR")
	if images == "" {
		testenv.Unavailable(t, "NODEKIT_IMAGES_DIR is unset: export NODEKIT_IMAGES_DIR=$(hack/setup-containerd.sh)")
	}
	crictl = filepath.Join(images, "crictl")
	if _, err := os.Stat(crictl); err != nil {
		testenv.Unavailable(t, "crictl not found in NODEKIT_IMAGES_DIR=%s", images)
	}
	return peers, images, crictl
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// rootLinks lists the machine's own network interfaces, to prove up and down leave
// them alone.
// rootLinks lists the machine's own network interfaces, leaving out those of the
// containerd test harness (its nkctd* CNI bridges and the veths on them), which other
// packages' tests may create and remove while this test runs.
func rootLinks(t *testing.T) []string {
	t.Helper()
	links, err := netlink.LinkList()
	require.NoError(t, err)
	byIndex := map[int]string{}
	for _, l := range links {
		byIndex[l.Attrs().Index] = l.Attrs().Name
	}
	var names []string
	for _, l := range links {
		a := l.Attrs()
		if strings.HasPrefix(a.Name, "nkctd") || strings.HasPrefix(byIndex[a.MasterIndex], "nkctd") {
			continue
		}
		names = append(names, a.Name)
	}
	sort.Strings(names)
	return names
}

func netnsWithPrefix(t *testing.T, prefix string) []string {
	t.Helper()
	entries, err := os.ReadDir("/var/run/netns")
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	b, err := os.ReadFile("/proc/self/mountinfo")
	require.NoError(t, err)
	var out []string
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) > 4 && (f[4] == dir || strings.HasPrefix(f[4], dir+"/")) {
			out = append(out, f[4])
		}
	}
	return out
}

// TestUpDetachStatusDown runs the built `nodekit up --detach` with two nodes, checks
// the API server through kubectl and the forwarder, each node's CRI through crictl
// inside its namespace, the clear refusals (second up on the same state, a port in use,
// a missing prerequisite) that harm nothing running, and that `down` leaves no process,
// mount, namespace or machine-side link behind.
func TestUpDetachStatusDown(t *testing.T) {
	peers, images, crictl := upEnv(t)
	kubectl := filepath.Join(peers, "kubectl")
	name := fmt.Sprintf("t%d", os.Getpid()%100000)
	stateDir := filepath.Join(t.TempDir(), "state")
	port := freePort(t)
	linksBefore := rootLinks(t)
	env := []string{"NODEKIT_PEERS_DIR=" + peers, "NODEKIT_IMAGES_DIR=" + images}
	upArgs := []string{"up", "--detach", "--name", name, "--state-dir", stateDir, "--nodes", "2", "--api-port", strconv.Itoa(port), "--coredns-image-tar="}

	begin := time.Now()
	out, stderr, code := nodekit(t, env, upArgs...)
	t.Cleanup(func() {
		// Whatever happened, leave the machine as it was.
		if _, err := os.Stat(filepath.Join(stateDir, cluster.StateFile)); err == nil {
			_, e, _ := nodekit(t, nil, "down", "--state-dir", stateDir)
			t.Logf("cleanup down: %s", e)
		}
	})
	require.Equal(t, 0, code, "up: stdout %s\nstderr %s", out, stderr)
	t.Logf("up --detach --nodes 2 returned in %s:\n%s%s", time.Since(begin).Round(time.Millisecond), out, stderr)
	kubeconfig := filepath.Join(stateDir, "kubeconfig")
	assert.Contains(t, out, "kubeconfig: "+kubeconfig)
	assert.Contains(t, out, fmt.Sprintf("cluster %q ready in", name))

	readyz := func() string {
		b, err := exec.Command(kubectl, "--kubeconfig", kubeconfig, "get", "--raw", "/readyz").CombinedOutput()
		require.NoError(t, err, "kubectl get --raw /readyz: %s", b)
		return string(b)
	}
	assert.Equal(t, "ok", readyz())

	// The kubernetes Service points at the API server's fabric address, so pods reach it.
	b, err := exec.Command(kubectl, "--kubeconfig", kubeconfig, "get", "endpointslices", "-n", "default", "-l", "kubernetes.io/service-name=kubernetes", "-o", "jsonpath={.items[0].endpoints[0].addresses[0]}").CombinedOutput()
	require.NoError(t, err, "%s", b)
	assert.Equal(t, cluster.ControlPlaneIP, string(b))

	st, err := cluster.LoadState(stateDir)
	require.NoError(t, err)
	require.Len(t, st.Nodes, 2)
	for _, n := range st.Nodes {
		b, err := exec.Command("nsenter", "--net=/var/run/netns/"+n.NetNS, crictl, "--config", filepath.Join(n.Dir, "crictl.yaml"), "info").CombinedOutput()
		require.NoError(t, err, "crictl info on %s: %s", n.Name, b)
		var info struct {
			Status struct {
				Conditions []struct {
					Type   string `json:"type"`
					Status bool   `json:"status"`
				} `json:"conditions"`
			} `json:"status"`
		}
		require.NoError(t, json.Unmarshal(b, &info), "crictl info on %s", n.Name)
		for _, c := range info.Status.Conditions {
			assert.True(t, c.Status, "node %s: CRI condition %s must be true (CNI configured before containerd started)", n.Name, c.Type)
		}
		assert.Len(t, info.Status.Conditions, 2)
		b, err = exec.Command("nsenter", "--net=/var/run/netns/"+n.NetNS, crictl, "--config", filepath.Join(n.Dir, "crictl.yaml"), "images", "-q").CombinedOutput()
		require.NoError(t, err, "%s", b)
		assert.Len(t, strings.Fields(string(b)), 2, "node %s: pause and busybox imported", n.Name)
	}

	out, _, code = nodekit(t, nil, "status", "--state-dir", stateDir)
	assert.Equal(t, 0, code, out)
	for _, part := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "supervisor", "api-server", "mirror"} {
		assert.Regexp(t, `(?m)^`+part+`\s+-\s+\S+\s+(running|ready)`, out)
	}
	assert.Regexp(t, `(?m)^cri\s+node-2\s+-\s+ready`, out)

	// Refusals: each names its cause and harms nothing running.
	_, stderr, code = nodekit(t, env, upArgs...)
	assert.Equal(t, exitError, code)
	assert.Contains(t, stderr, "state dir in use: "+stateDir)
	assert.Contains(t, stderr, "run `nodekit down --state-dir "+stateDir+"` first")

	_, stderr, code = nodekit(t, env, "up", "--detach", "--name", name+"b", "--state-dir", filepath.Join(t.TempDir(), "b"), "--api-port", strconv.Itoa(port))
	assert.Equal(t, exitError, code)
	assert.Contains(t, stderr, fmt.Sprintf("127.0.0.1:%d", port))
	assert.Contains(t, stderr, "address already in use")

	_, stderr, code = nodekit(t, env, "up", "--detach", "--name", name, "--state-dir", filepath.Join(t.TempDir(), "c"), "--api-port", strconv.Itoa(freePort(t)))
	assert.Equal(t, exitError, code)
	assert.Contains(t, stderr, "network namespace nk-"+name+"-fabric exists")

	_, stderr, code = nodekit(t, []string{"NODEKIT_PEERS_DIR=/nonexistent"}, "up", "--detach", "--name", name+"d", "--state-dir", filepath.Join(t.TempDir(), "d"), "--api-port", strconv.Itoa(freePort(t)))
	assert.Equal(t, exitError, code)
	assert.Contains(t, stderr, "missing prerequisite: etcd not found in /nonexistent")
	assert.Equal(t, "ok", readyz(), "the first cluster must be unharmed")

	// down removes exactly what up made.
	_, stderr, code = nodekit(t, nil, "down", "--state-dir", stateDir)
	require.Equal(t, 0, code, stderr)
	for _, p := range st.Processes {
		assert.False(t, p.Alive(), "%s (pid %d) still runs after down", p.Name, p.PID)
	}
	for _, n := range st.Nodes {
		out, _ := exec.Command("pgrep", "-f", n.Runtime[len("unix://"):]).Output()
		assert.Empty(t, strings.TrimSpace(string(out)), "no shim or process of node %s's containerd may remain", n.Name)
	}
	assert.Empty(t, mountsUnder(t, stateDir))
	assert.Empty(t, netnsWithPrefix(t, "nk-"+name+"-"))
	assert.Equal(t, linksBefore, rootLinks(t), "the machine's own interfaces must be untouched")
	_, err = os.Stat(stateDir)
	assert.True(t, os.IsNotExist(err), "the state dir up made must be gone: %v", err)

	_, stderr, code = nodekit(t, nil, "down", "--state-dir", stateDir)
	assert.Equal(t, exitError, code)
	assert.Contains(t, stderr, "no cluster in "+stateDir)
}

// TestUpForegroundCtrlC runs `nodekit up` in the foreground, imports an image with
// `nodekit load`, then interrupts it as Ctrl-C would: it must tear everything down.
func TestUpForegroundCtrlC(t *testing.T) {
	peers, images, crictl := upEnv(t)
	name := fmt.Sprintf("f%d", os.Getpid()%100000)
	stateDir := filepath.Join(t.TempDir(), "state")
	cmd := exec.Command(nodekitBin, "up", "--name", name, "--state-dir", stateDir, "--api-port", strconv.Itoa(freePort(t)),
		"--kubelet-binary", "none", "--kube-proxy-binary", "none", "--coredns-image-tar=")
	cmd.Env = append(os.Environ(), "NODEKIT_PEERS_DIR="+peers, "NODEKIT_IMAGES_DIR="+images)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	// stderr goes to a file: it is read only after the process is done with it.
	errPath := filepath.Join(t.TempDir(), "up.stderr")
	errFile, err := os.Create(errPath)
	require.NoError(t, err)
	defer errFile.Close()
	cmd.Stderr = errFile
	stderrText := func() string { b, _ := os.ReadFile(errPath); return string(b) }
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if _, err := os.Stat(filepath.Join(stateDir, cluster.StateFile)); err == nil {
			nodekit(t, nil, "down", "--state-dir", stateDir)
		}
	})
	ready := make(chan string, 1)
	go func() {
		var seen strings.Builder
		buf := make([]byte, 4096)
		for {
			n, err := stdout.Read(buf)
			seen.Write(buf[:n])
			if strings.Contains(seen.String(), "ready in") || err != nil {
				ready <- seen.String()
				_, _ = io.Copy(io.Discard, stdout)
				return
			}
		}
	}()
	select {
	case out := <-ready:
		require.Contains(t, out, "ready in", "stderr: %s", stderrText())
	case <-time.After(2 * time.Minute):
		t.Fatalf("up did not get ready: %s", stderrText())
	}
	st, err := cluster.LoadState(stateDir)
	require.NoError(t, err)

	// nodekit load imports into every node (here, the pause image under its own name).
	_, lerr, code := nodekit(t, nil, "load", "--state-dir", stateDir, filepath.Join(images, "pause.tar"))
	require.Equal(t, 0, code, lerr)
	_, lerr, code = nodekit(t, nil, "load", "--state-dir", stateDir, filepath.Join(images, "missing.tar"))
	assert.Equal(t, exitError, code)
	assert.Contains(t, lerr, "missing.tar")
	b, err := exec.Command("nsenter", "--net=/var/run/netns/"+st.Nodes[0].NetNS, crictl, "--config", filepath.Join(st.Nodes[0].Dir, "crictl.yaml"), "images").CombinedOutput()
	require.NoError(t, err, "%s", b)
	assert.Contains(t, string(b), "registry.k8s.io/pause")

	require.NoError(t, cmd.Process.Signal(os.Interrupt))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		assert.NoError(t, err, "up must exit 0 after Ctrl-C: %s", stderrText())
	case <-time.After(time.Minute):
		t.Fatal("up did not stop after Ctrl-C")
	}
	assert.Contains(t, stderrText(), "nodekit down: deleted network namespace nk-"+name+"-fabric")
	for _, p := range st.Processes {
		assert.False(t, p.Alive(), "%s still runs", p.Name)
	}
	assert.Empty(t, mountsUnder(t, stateDir))
	assert.Empty(t, netnsWithPrefix(t, "nk-"+name+"-"))
}

// TestCoreDNSAddon: with the CoreDNS image hack/build-coredns.sh builds, up imports it
// into every node and deploys the add-on as kubeadm does.
func TestCoreDNSAddon(t *testing.T) {
	peers, images, crictl := upEnv(t)
	tar := os.Getenv("NODEKIT_COREDNS_IMAGE_TAR")
	if tar == "" {
		testenv.Unavailable(t, "NODEKIT_COREDNS_IMAGE_TAR is unset: export NODEKIT_COREDNS_IMAGE_TAR=$(hack/build-coredns.sh)")
	}
	kubectl := filepath.Join(peers, "kubectl")
	name := fmt.Sprintf("d%d", os.Getpid()%100000)
	stateDir := filepath.Join(t.TempDir(), "state")
	out, stderr, code := nodekit(t, []string{"NODEKIT_PEERS_DIR=" + peers, "NODEKIT_IMAGES_DIR=" + images},
		"up", "--detach", "--name", name, "--state-dir", stateDir, "--api-port", strconv.Itoa(freePort(t)),
		"--nodes", "2", "--kubelet-binary", "none", "--kube-proxy-binary", "none", "--coredns-image-tar", tar)
	t.Cleanup(func() {
		if _, err := os.Stat(filepath.Join(stateDir, cluster.StateFile)); err == nil {
			nodekit(t, nil, "down", "--state-dir", stateDir)
		}
	})
	require.Equal(t, 0, code, "%s\n%s", out, stderr)
	assert.Contains(t, stderr, "CoreDNS add-on deployed (kube-dns at 10.96.0.10)")
	kc := filepath.Join(stateDir, "kubeconfig")
	get := func(args ...string) string {
		b, err := exec.Command(kubectl, append([]string{"--kubeconfig", kc}, args...)...).CombinedOutput()
		require.NoError(t, err, "kubectl %v: %s", args, b)
		return string(b)
	}
	assert.Equal(t, "10.96.0.10 dns/UDP/53 dns-tcp/TCP/53 metrics/TCP/9153 ",
		get("get", "service", "-n", "kube-system", "kube-dns", "-o", `jsonpath={.spec.clusterIP} {range .spec.ports[*]}{.name}/{.protocol}/{.port} {end}`))
	assert.Contains(t, get("get", "configmap", "-n", "kube-system", "coredns", "-o", "jsonpath={.data.Corefile}"), "kubernetes cluster.local in-addr.arpa ip6.arpa {")
	assert.Equal(t, cluster.CoreDNSImage, get("get", "deployment", "-n", "kube-system", "coredns", "-o", "jsonpath={.spec.template.spec.containers[0].image}"))
	assert.Equal(t, "yes\n", get("auth", "can-i", "list", "endpointslices.discovery.k8s.io", "--as=system:serviceaccount:kube-system:coredns"))
	st, err := cluster.LoadState(stateDir)
	require.NoError(t, err)
	for _, n := range st.Nodes {
		b, err := exec.Command("nsenter", "--net=/var/run/netns/"+n.NetNS, crictl, "--config", filepath.Join(n.Dir, "crictl.yaml"), "images").CombinedOutput()
		require.NoError(t, err, "%s", b)
		assert.Regexp(t, `registry.k8s.io/coredns/coredns\s+v1.14.6`, string(b), "node %s", n.Name)
	}
	_, stderr, code = nodekit(t, nil, "down", "--state-dir", stateDir)
	require.Equal(t, 0, code, stderr)
	assert.Empty(t, netnsWithPrefix(t, "nk-"+name+"-"))
}
