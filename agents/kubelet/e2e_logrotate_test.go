package main_test

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/nodekit-dev/nodekit/cri"
	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/containerd"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
)

// rotatedName is a rotated log's name as the kubelet makes it: <log>.<YYYYMMDD-hhmmss>,
// with .gz once compressed.
var rotatedName = regexp.MustCompile(`^0\.log\.\d{8}-\d{6}(\.gz)?$`)

// criLine is one line of the CRI log format as containerd writes it: a full line
// (F), or a part of one (P) where containerd's read of the pipe ended mid-line.
var criLine = regexp.MustCompile(`^\S+ stdout (F (x{1,99}|mark \d+|ready|done|final)|P x+)$`)

// TestKubeletLogRotation runs a pod writing about 1 MiB/s on a node with
// containerLogMaxSize 1Mi, containerLogMaxFiles 3 and a 3s monitor interval, with
// real containerd: its log is rotated under the kubelet's names (the newest rotated
// file plain, older ones gzipped, never more than 3 files), `kubectl logs -f`
// started before keeps following across rotations, and `kubectl logs` and crictl
// read the live log afterwards.
func TestKubeletLogRotation(t *testing.T) {
	testenv.RequireLong(t)
	testenv.RequireRoot(t)
	egress := &nodeEgress{}
	cp := controlplane.Start(t, controlplane.Options{ClusterEgress: egress.dial})
	n := startNodeWithConfig(t, cp, "nk-rotate", true,
		"containerLogMaxSize: 1Mi\ncontainerLogMaxFiles: 3\ncontainerLogMonitorInterval: 3s\n")
	egress.set(n.env.Node)
	admin := cp.AdminKubeconfig()
	n.waitReady(t, corev1.ConditionTrue, 60*time.Second)

	const marks = 60
	// 2048 lines of 99 x (about 280 KiB of CRI log) then "mark i", four times a
	// second, once /tmp/go exists.
	script := fmt.Sprintf(`echo ready; while [ ! -f /tmp/go ]; do sleep 0.1; done; i=0; while [ $i -lt %d ]; do i=$((i+1)); yes %s | head -n 2048; echo "mark $i"; sleep 0.25; done; echo done; sleep 6; echo final; exec sleep 3600`,
		marks, strings.Repeat("x", 99))
	n.createPod(t, busyboxPod("rot", n.ctd.BusyboxImage(), corev1.RestartPolicyNever, script))
	pod := n.waitPod(t, "rot", 60*time.Second, "Running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	dir := filepath.Join(cri.PodLogsDirectory(filepath.Join(n.dir, "logs"), pod), "main")

	// Follow from before the first rotation.
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	follow := exec.CommandContext(ctx, testenv.PeerBinary(t, "kubectl"), "--kubeconfig", admin, "logs", "-f", "rot")
	stdout, err := follow.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, follow.Start())
	defer func() { _ = follow.Process.Kill(); _ = follow.Wait() }()
	followed := make(chan string, 1024)
	go func() {
		defer close(followed)
		r := bufio.NewReader(stdout)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if !strings.HasPrefix(line, "xxx") {
				followed <- strings.TrimSuffix(line, "\n")
			}
		}
	}()
	select {
	case l := <-followed:
		require.Equal(t, "ready", l)
	case <-time.After(30 * time.Second):
		t.Fatal("kubectl logs -f: no first line")
	}
	_, e, code := runKubectl(t, admin, "", 20*time.Second, "exec", "rot", "--", "touch", "/tmp/go")
	require.Equal(t, 0, code, e)

	// While it writes: count the rotations (distinct stamps) and check that no more
	// than containerLogMaxFiles files make up the log at any time.
	stamps := map[string]bool{}
	sample := func() []string {
		t.Helper()
		es, err := os.ReadDir(dir)
		require.NoError(t, err)
		var names []string
		files := map[string]bool{}
		for _, e := range es {
			name := e.Name()
			names = append(names, name)
			// A compression in progress has name.gz.tmp, and for an instant both
			// name and name.gz exist: one file of the log each.
			base := strings.TrimSuffix(strings.TrimSuffix(name, ".tmp"), ".gz")
			files[base] = true
			if base != "0.log" {
				require.Regexp(t, rotatedName, base)
				stamps[base] = true
			}
		}
		assert.LessOrEqual(t, len(files), 3, "files of the log: %v", names)
		return names
	}
	var lastMark int
	deadline := time.Now().Add(90 * time.Second)
	for done := false; !done; {
		require.True(t, time.Now().Before(deadline), "the writer did not finish; followed up to mark %d, rotations %v", lastMark, stamps)
		sample()
	drain:
		for {
			select {
			case l, ok := <-followed:
				require.True(t, ok, "kubectl logs -f ended early after mark %d", lastMark)
				if l == "done" {
					done = true
					break drain
				}
				if m, ok := strings.CutPrefix(l, "mark "); ok {
					i, err := strconv.Atoi(m)
					require.NoError(t, err)
					assert.Greater(t, i, lastMark, "marks in order")
					lastMark = i
				}
			case <-time.After(200 * time.Millisecond):
				break drain
			}
		}
	}
	t.Logf("rotations seen: %d; kubectl logs -f reached mark %d and done", len(stamps), lastMark)
	require.GreaterOrEqual(t, len(stamps), 3, "the log rotated several times: %v", stamps)
	assert.Equal(t, marks, lastMark, "kubectl logs -f followed to the last mark across rotations")

	// Writing has stopped: after a pass or two, the log is the live file, the newest
	// rotated one plain and one older gzipped; no leftovers.
	// Settled means the same files for longer than a monitor interval: the last
	// writes may still push the live file over the limit for one more rotation.
	var names []string
	var prev string
	var since time.Time
	eventually(t, 30*time.Second, "the log settled", func() (bool, string) {
		names = sample()
		if cur := fmt.Sprint(names); cur != prev {
			prev, since = cur, time.Now()
		}
		if time.Since(since) < 4*time.Second {
			return false, "changed in the last 4s: " + prev
		}
		var gz, plain int
		for _, name := range names {
			switch {
			case name == "0.log":
			case strings.HasSuffix(name, ".gz") && rotatedName.MatchString(name):
				gz++
			case rotatedName.MatchString(name):
				plain++
			default:
				return false, fmt.Sprintf("unexpected %s in %v", name, names)
			}
		}
		return gz == 1 && plain == 1 && len(names) == 3, fmt.Sprint(names)
	})
	sort.Strings(names)
	// Names sort by time: the compressed one is the older.
	require.True(t, strings.HasSuffix(names[1], ".gz"), "%v", names)
	require.False(t, strings.HasSuffix(names[2], ".gz"), "%v", names)
	for _, name := range names[1:] {
		b, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		if strings.HasSuffix(name, ".gz") {
			zr, err := gzip.NewReader(bytes.NewReader(b))
			require.NoError(t, err)
			b, err = io.ReadAll(zr)
			require.NoError(t, err, "gunzip %s", name)
		}
		lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
		require.Greater(t, len(lines), 1000, "%s holds about a rotation's worth", name)
		for i, l := range lines {
			require.Regexp(t, criLine, l, "%s line %d", name, i+1)
		}
	}

	// The live log reads as usual, through the kubelet and through crictl. Its last
	// line is "final", written 6 s after "done": whether the last marks went to a
	// rotated file depends on where the size limit fell, but by then nothing more
	// rotates.
	eventually(t, 30*time.Second, "kubectl logs --tail=1 shows the last line", func() (bool, string) {
		out, e, _ := runKubectl(t, admin, "", 20*time.Second, "logs", "rot", "--tail=1")
		return out == "final\n", out + e
	})
	pod = n.waitPod(t, "rot", 10*time.Second, "with a container ID", func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) == 1 && p.Status.ContainerStatuses[0].ContainerID != ""
	})
	id := strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	cctx, ccancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer ccancel()
	crictl := exec.CommandContext(cctx, containerd.Crictl(t), n.ctd.CrictlArgs("logs", "--tail", "1", id)...)
	b, err := crictl.CombinedOutput()
	require.NoError(t, err, "crictl logs: %s", b)
	assert.Equal(t, "final\n", string(b))
	assert.NotContains(t, n.log(t), "Failed to rotate")
	assert.NotContains(t, n.log(t), "not honoured")
}
