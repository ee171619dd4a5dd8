package main_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/cgroups"
	"github.com/opencontainers/cgroups/fs"
	"github.com/opencontainers/cgroups/fs2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/controlplane"
)

// makeCgroupRoot creates a cgroup of the node's own (the kubelet's cgroupRoot,
// which the kubelet requires to exist) and removes it, with whatever is left in
// it, at cleanup.
func makeCgroupRoot(t testing.TB, node string) string {
	t.Helper()
	root := fmt.Sprintf("/nk-test-%s-%d", node, os.Getpid())
	cg := &cgroups.Cgroup{Path: root, Resources: &cgroups.Resources{SkipDevices: true}}
	var m cgroups.Manager
	var err error
	if cgroups.IsCgroup2UnifiedMode() {
		m, err = fs2.NewManager(cg, filepath.Join("/sys/fs/cgroup", root))
	} else {
		m, err = fs.NewManager(cg, nil)
	}
	require.NoError(t, err)
	require.NoError(t, m.Apply(-1), "create cgroup %s", root)
	t.Cleanup(func() {
		for range 10 {
			pids := 0
			for _, p := range m.GetPaths() {
				list, _ := cgroups.GetAllPids(p)
				for _, pid := range list {
					pids++
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			if pids == 0 {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if err := m.Destroy(); err != nil {
			t.Logf("remove cgroup %s: %v", root, err)
		}
	})
	return root
}

// cgroupFile reads a cgroup v1 file of controller ctrl for cgroup name.
func cgroupFile(t testing.TB, ctrl, name, file string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", ctrl, name, file))
	require.NoError(t, err)
	return strings.TrimSpace(string(b))
}

func cgroupExists(ctrl, name string) bool {
	_, err := os.Stat(filepath.Join("/sys/fs/cgroup", ctrl, name))
	return err == nil
}

func withResources(p *corev1.Pod, req, lim corev1.ResourceList) *corev1.Pod {
	p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Requests: req, Limits: lim}
	return p
}

func rl(cpu, mem string) corev1.ResourceList {
	out := corev1.ResourceList{}
	if cpu != "" {
		out[corev1.ResourceCPU] = resource.MustParse(cpu)
	}
	if mem != "" {
		out[corev1.ResourceMemory] = resource.MustParse(mem)
	}
	return out
}

// TestKubeletPodCgroups runs pods of the three QoS classes on a real node and
// reads the cgroup files the kubelet (and containerd, under the CgroupParent the
// kubelet gives) wrote: the kubepods tree, each pod's cgroup values, an OOM kill
// at the memory limit, the managed /etc/hosts seen from inside a container, a
// missing image pull secret that does not stop a local image, and the pod cgroups
// removed after the pods are deleted.
func TestKubeletPodCgroups(t *testing.T) {
	testenv.RequireRoot(t)
	if cgroups.IsCgroup2UnifiedMode() {
		t.Skip("the cgroup file checks are written for cgroup v1 (this machine's); v2 is not covered")
	}
	cp := controlplane.Start(t, controlplane.Options{})
	n := startNode(t, cp, "nk-node-cg", true)
	n.waitReady(t, corev1.ConditionTrue, 60*time.Second)
	image := n.ctd.BusyboxImage()
	kubepods := n.cgroupRoot + "/kubepods"
	running := func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) > 0
	}

	t.Run("the kubepods tree with node allocatable limits", func(t *testing.T) {
		ncpu := 0
		node, err := n.admin.CoreV1().Nodes().Get(context.Background(), n.name, metav1.GetOptions{})
		require.NoError(t, err)
		c := node.Status.Capacity[corev1.ResourceCPU]
		ncpu = int(c.Value())
		assert.Equal(t, strconv.Itoa(ncpu*1024), cgroupFile(t, "cpu", kubepods, "cpu.shares"))
		memTotal := readMemTotal(t)
		limit, err := strconv.ParseInt(cgroupFile(t, "memory", kubepods, "memory.limit_in_bytes"), 10, 64)
		require.NoError(t, err)
		// The kernel rounds the limit down to a page.
		assert.LessOrEqual(t, limit, memTotal)
		assert.Greater(t, limit, memTotal-int64(os.Getpagesize()))
		pidMax := readTrim(t, "/proc/sys/kernel/pid_max")
		assert.Equal(t, pidMax, cgroupFile(t, "pids", kubepods, "pids.max"))
		assert.Equal(t, "2", cgroupFile(t, "cpu", kubepods+"/besteffort", "cpu.shares"))
		eventually(t, 20*time.Second, "NodeAllocatableEnforced event", func() (bool, string) {
			return hasEvent(n.events(t, n.name), "NodeAllocatableEnforced", "Updated Node Allocatable limit across pods"), ""
		})
		for _, ctrl := range []string{"cpu", "cpuacct", "cpuset", "memory", "pids"} {
			for _, q := range []string{"", "/burstable", "/besteffort"} {
				assert.True(t, cgroupExists(ctrl, kubepods+q), "%s %s", ctrl, kubepods+q)
			}
		}
	})

	g := withResources(busyboxPod("guaranteed", image, corev1.RestartPolicyAlways, "sleep 3600"), rl("250m", "64Mi"), rl("250m", "64Mi"))
	g.Spec.Subdomain = "grp"
	g.Spec.HostAliases = []corev1.HostAlias{{IP: "10.1.2.3", Hostnames: []string{"foo.remote", "bar.remote"}}}
	g = n.createPod(t, g)
	b := n.createPod(t, withResources(busyboxPod("burstable", image, corev1.RestartPolicyAlways, "sleep 3600"), rl("100m", "16Mi"), rl("200m", "32Mi")))
	be := busyboxPod("besteffort", image, corev1.RestartPolicyAlways, "sleep 3600")
	be.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "no-such-secret"}}
	be = n.createPod(t, be)
	gRun := n.waitPod(t, "guaranteed", 60*time.Second, "running", running)
	bRun := n.waitPod(t, "burstable", 60*time.Second, "running", running)
	beRun := n.waitPod(t, "besteffort", 60*time.Second, "running (a missing pull secret does not stop a local image)", running)
	assert.Equal(t, corev1.PodQOSGuaranteed, gRun.Status.QOSClass)
	assert.Equal(t, corev1.PodQOSBurstable, bRun.Status.QOSClass)
	assert.Equal(t, corev1.PodQOSBestEffort, beRun.Status.QOSClass)
	gCg := kubepods + "/pod" + string(g.UID)
	bCg := kubepods + "/burstable/pod" + string(b.UID)
	beCg := kubepods + "/besteffort/pod" + string(be.UID)

	t.Run("each pod in its QoS class's cgroup with upstream's values", func(t *testing.T) {
		// Guaranteed 250m/64Mi: shares 250*1024/1000, quota 250*100000/1000.
		assert.Equal(t, "256", cgroupFile(t, "cpu", gCg, "cpu.shares"))
		assert.Equal(t, "25000", cgroupFile(t, "cpu", gCg, "cpu.cfs_quota_us"))
		assert.Equal(t, "100000", cgroupFile(t, "cpu", gCg, "cpu.cfs_period_us"))
		assert.Equal(t, strconv.Itoa(64<<20), cgroupFile(t, "memory", gCg, "memory.limit_in_bytes"))
		// Burstable 100m request, 200m/32Mi limits on its only container.
		assert.Equal(t, "102", cgroupFile(t, "cpu", bCg, "cpu.shares"))
		assert.Equal(t, "20000", cgroupFile(t, "cpu", bCg, "cpu.cfs_quota_us"))
		assert.Equal(t, strconv.Itoa(32<<20), cgroupFile(t, "memory", bCg, "memory.limit_in_bytes"))
		// BestEffort: 2 shares, no quota, no memory limit.
		assert.Equal(t, "2", cgroupFile(t, "cpu", beCg, "cpu.shares"))
		assert.Equal(t, "-1", cgroupFile(t, "cpu", beCg, "cpu.cfs_quota_us"))
		assert.Equal(t, cgroupFile(t, "memory", "/", "memory.limit_in_bytes"), cgroupFile(t, "memory", beCg, "memory.limit_in_bytes"))
		// The burstable class has the sum of the Burstable pods' requests.
		assert.Equal(t, "102", cgroupFile(t, "cpu", kubepods+"/burstable", "cpu.shares"))
		// The containers run inside their pod's cgroup (containerd used the
		// CgroupParent): /proc/self/cgroup seen from the container.
		for pod, cg := range map[*corev1.Pod]string{gRun: gCg, bRun: bCg, beRun: beCg} {
			out, code := n.exec(t, pod, "cat", "/proc/self/cgroup")
			require.Equal(t, 0, code)
			assert.Contains(t, out, ":memory:"+cg+"/", "pod %s", pod.Name)
		}
	})

	t.Run("containerd's ListPodSandboxStats answers for pods with a cgroup parent", func(t *testing.T) {
		// containerd 1.6 fails the whole call when a sandbox has no cgroup parent.
		rs := runtimeapi.NewRuntimeServiceClient(n.ctd.Conn(t))
		resp, err := rs.ListPodSandboxStats(context.Background(), &runtimeapi.ListPodSandboxStatsRequest{})
		require.NoError(t, err)
		seen := map[string]bool{}
		for _, st := range resp.GetStats() {
			seen[st.GetAttributes().GetMetadata().GetName()] = st.GetLinux().GetCpu() != nil
		}
		for _, name := range []string{"guaranteed", "burstable", "besteffort"} {
			assert.True(t, seen[name], "cpu stats of pod %s in %v", name, seen)
		}
	})

	t.Run("the managed /etc/hosts inside the container", func(t *testing.T) {
		out, code := n.exec(t, gRun, "cat", "/etc/hosts")
		require.Equal(t, 0, code)
		want := "# Kubernetes-managed hosts file.\n" +
			"127.0.0.1\tlocalhost\n" +
			"::1\tlocalhost ip6-localhost ip6-loopback\n" +
			"fe00::0\tip6-localnet\n" +
			"fe00::0\tip6-mcastprefix\n" +
			"fe00::1\tip6-allnodes\n" +
			"fe00::2\tip6-allrouters\n" +
			gRun.Status.PodIP + "\tguaranteed.grp.default.svc.cluster.local\tguaranteed\n" +
			"\n# Entries added by HostAliases.\n" +
			"10.1.2.3\tfoo.remote\tbar.remote\n"
		assert.Equal(t, want, out)
		host, err := os.ReadFile(filepath.Join(n.dir, "root", "pods", string(g.UID), "etc-hosts"))
		require.NoError(t, err)
		assert.Equal(t, want, string(host))
		out, _ = n.exec(t, bRun, "cat", "/etc/hosts")
		assert.Contains(t, out, bRun.Status.PodIP+"\tburstable\n")
	})

	t.Run("a missing pull secret is an event, not a failure", func(t *testing.T) {
		eventually(t, 20*time.Second, "FailedToRetrieveImagePullSecret event", func() (bool, string) {
			ev := n.events(t, "besteffort")
			return hasEvent(ev, "FailedToRetrieveImagePullSecret",
				"Unable to retrieve some image pull secrets (no-such-secret); attempting to pull the image may not succeed."), fmt.Sprint(len(ev))
		})
	})

	t.Run("a pod over its memory limit is OOMKilled", func(t *testing.T) {
		// A shell variable holding 64 MiB in a 16 MiB pod.
		p := withResources(busyboxPod("hog", image, corev1.RestartPolicyNever, `x=$(head -c 67108864 /dev/zero | tr '\0' a); echo survived`),
			rl("", "16Mi"), rl("", "16Mi"))
		p = n.createPod(t, p)
		done := n.waitPod(t, "hog", 60*time.Second, "failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
		require.Len(t, done.Status.ContainerStatuses, 1)
		term := done.Status.ContainerStatuses[0].State.Terminated
		require.NotNil(t, term)
		assert.Equal(t, "OOMKilled", term.Reason)
		assert.Equal(t, int32(137), term.ExitCode)
		assert.Equal(t, strconv.Itoa(16<<20), cgroupFile(t, "memory", kubepods+"/burstable/pod"+string(p.UID), "memory.limit_in_bytes"))
	})

	t.Run("a pod deleted while the kubelet was down loses its cgroup after the restart", func(t *testing.T) {
		p := n.createPod(t, withResources(busyboxPod("orphan", image, corev1.RestartPolicyAlways, "sleep 3600"), rl("50m", ""), nil))
		n.waitPod(t, "orphan", 60*time.Second, "running", running)
		cg := kubepods + "/burstable/pod" + string(p.UID)
		require.True(t, cgroupExists("cpu", cg))
		n.stopKubelet()
		require.NoError(t, n.admin.CoreV1().Pods("default").Delete(context.Background(), "orphan", metav1.DeleteOptions{GracePeriodSeconds: new(int64)}))
		n.startKubelet(t)
		eventually(t, 60*time.Second, "orphan pod cgroup removed", func() (bool, string) {
			return !cgroupExists("cpu", cg) && !cgroupExists("memory", cg), cg
		})
		assert.Contains(t, n.log(t), `"Removing the cgroup of a pod no longer on this node" podUID="`+string(p.UID)+`"`)
	})

	t.Run("pod cgroups are removed after the pods are deleted", func(t *testing.T) {
		ctx := context.Background()
		for _, name := range []string{"guaranteed", "burstable", "besteffort", "hog"} {
			require.NoError(t, n.admin.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{}))
		}
		eventually(t, 60*time.Second, "pod cgroups removed", func() (bool, string) {
			var left []string
			for _, cg := range []string{gCg, bCg, beCg} {
				for _, ctrl := range []string{"cpu", "memory", "pids", "cpuset"} {
					if cgroupExists(ctrl, cg) {
						left = append(left, ctrl+":"+cg)
					}
				}
			}
			return len(left) == 0, strings.Join(left, " ")
		})
		// The QoS tree stays; the burstable class is back to 2 shares within the
		// periodic update (1 min) or the next pod start.
		assert.True(t, cgroupExists("cpu", kubepods+"/burstable"))
	})
}

// TestKubeletPodMovedIntoItsCgroup: a pod running outside its pod cgroup (here:
// the kubelet restarted with another cgroupRoot, as when a node is upgraded to
// the QoS hierarchy) is killed and restarted inside it, as the kubelet's SyncPod
// does.
func TestKubeletPodMovedIntoItsCgroup(t *testing.T) {
	testenv.RequireRoot(t)
	if cgroups.IsCgroup2UnifiedMode() {
		t.Skip("the cgroup file checks are written for cgroup v1 (this machine's); v2 is not covered")
	}
	cp := controlplane.Start(t, controlplane.Options{})
	n := startNode(t, cp, "nk-node-cgmove", true)
	n.waitReady(t, corev1.ConditionTrue, 60*time.Second)
	image := n.ctd.BusyboxImage()
	p := n.createPod(t, busyboxPod("mover", image, corev1.RestartPolicyAlways, "sleep 3600"))
	first := n.waitPod(t, "mover", 60*time.Second, "running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	oldID := first.Status.ContainerStatuses[0].ContainerID

	n.stopKubelet()
	newRoot := makeCgroupRoot(t, "nk-node-cgmove2")
	cfgPath := filepath.Join(n.dir, "config.yaml")
	b, err := os.ReadFile(cfgPath)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(cfgPath, []byte(strings.Replace(string(b), "cgroupRoot: "+n.cgroupRoot, "cgroupRoot: "+newRoot, 1)), 0o600))
	n.startKubelet(t)

	moved := n.waitPod(t, "mover", 60*time.Second, "running again in a new container", func(p *corev1.Pod) bool {
		return p.Status.Phase == corev1.PodRunning && len(p.Status.ContainerStatuses) == 1 &&
			p.Status.ContainerStatuses[0].ContainerID != oldID && p.Status.ContainerStatuses[0].State.Running != nil
	})
	out, code := n.exec(t, moved, "cat", "/proc/self/cgroup")
	require.Equal(t, 0, code)
	assert.Contains(t, out, ":memory:"+newRoot+"/kubepods/besteffort/pod"+string(p.UID)+"/")
	assert.Contains(t, n.log(t), `"Pod runs outside its pod cgroup; killing it to restart it inside" pod="default/mover"`)
}

// TestKubeletWithoutCgroupsPerQOS: cgroupsPerQOS false makes no kubepods tree
// and parents every sandbox at the cgroup root, as the kubelet does.
func TestKubeletWithoutCgroupsPerQOS(t *testing.T) {
	testenv.RequireRoot(t)
	if cgroups.IsCgroup2UnifiedMode() {
		t.Skip("the cgroup file checks are written for cgroup v1 (this machine's); v2 is not covered")
	}
	cp := controlplane.Start(t, controlplane.Options{})
	n := startNodeWithConfig(t, cp, "nk-node-noqos", true, "cgroupsPerQOS: false\n")
	n.waitReady(t, corev1.ConditionTrue, 60*time.Second)
	n.createPod(t, withResources(busyboxPod("flat", n.ctd.BusyboxImage(), corev1.RestartPolicyAlways, "sleep 3600"), rl("100m", ""), nil))
	p := n.waitPod(t, "flat", 60*time.Second, "running", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	id := strings.TrimPrefix(p.Status.ContainerStatuses[0].ContainerID, "containerd://")
	out, code := n.exec(t, p, "cat", "/proc/self/cgroup")
	require.Equal(t, 0, code)
	assert.Contains(t, out, ":memory:"+n.cgroupRoot+"/"+id+"\n")
	for _, ctrl := range []string{"cpu", "memory"} {
		assert.False(t, cgroupExists(ctrl, n.cgroupRoot+"/kubepods"), ctrl)
	}
	assert.NotContains(t, n.log(t), "not honoured")
}

func readTrim(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return strings.TrimSpace(string(b))
}

func readMemTotal(t testing.TB) int64 {
	t.Helper()
	for _, line := range strings.Split(readTrim(t, "/proc/meminfo"), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			require.NoError(t, err)
			return kb * 1024
		}
	}
	t.Fatal("no MemTotal in /proc/meminfo")
	return 0
}
