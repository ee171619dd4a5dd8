package cri_test

// Integration tests against a real containerd + runc started by
// internal/testenv/containerd. They skip with a reason when run casually without root
// or NODEKIT_IMAGES_DIR, and fail under CI=true.

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/cri"
	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/containerd"
)

func busyboxPod(name, image string, command ...string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "nodekit-test", UID: types.UID("uid-" + name), Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{
			Name:    "main",
			Image:   image,
			Command: command,
		}}},
	}
}

func connect(t *testing.T, endpoint string) *cri.Client {
	t.Helper()
	c, err := cri.New(context.Background(), cri.Config{Endpoint: endpoint, CallTimeout: 30 * time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// startPod runs a sandbox and one started container for pod, creating the log
// directory as the kubelet does.
func startPod(t *testing.T, c *cri.Client, pod *corev1.Pod, image, logsDir string) (sandboxID, containerID string, sbCfg *runtimeapi.PodSandboxConfig) {
	t.Helper()
	ctx := context.Background()
	sbCfg, err := cri.PodSandboxConfig(pod, cri.PodOptions{LogsDir: logsDir})
	require.NoError(t, err)
	sandboxID, err = c.RunPodSandbox(ctx, sbCfg, "")
	require.NoError(t, err)
	ctrCfg, err := cri.ContainerConfig(pod, "main", 0, image)
	require.NoError(t, err)
	require.NoError(t, os.MkdirAll(filepath.Join(sbCfg.LogDirectory, "main"), 0o755))
	containerID, err = c.CreateContainer(ctx, sandboxID, ctrCfg, sbCfg)
	require.NoError(t, err)
	require.NoError(t, c.StartContainer(ctx, containerID))
	return sandboxID, containerID, sbCfg
}

func TestContainerdPodLifecycle(t *testing.T) {
	testenv.RequireLong(t)
	rt := containerd.Start(t, containerd.Options{CNI: true, Registry: true})
	c := connect(t, rt.Endpoint())
	ctx := context.Background()
	assert.Equal(t, "containerd", c.RuntimeVersion().GetRuntimeName())

	ready, err := c.Readiness(ctx)
	require.NoError(t, err)
	assert.True(t, ready.Ready, ready.Message)

	// A real pull from the loopback registry.
	image := rt.RegistryImage()
	present, err := c.ImagePresent(ctx, image)
	require.NoError(t, err)
	require.False(t, present)
	ref, pulled, err := c.EnsureImage(ctx, image, nil, nil)
	require.NoError(t, err)
	assert.True(t, pulled)
	assert.True(t, strings.HasPrefix(ref, "sha256:"), ref)

	logsDir := t.TempDir()
	pod := busyboxPod("lifecycle", image, "sh", "-c", "echo started; exec sleep 3600")
	sandboxID, containerID, _ := startPod(t, c, pod, ref, logsDir)

	sb, err := c.PodSandboxStatus(ctx, sandboxID)
	require.NoError(t, err)
	ip := net.ParseIP(sb.GetNetwork().GetIp())
	require.NotNil(t, ip, "the sandbox has an IP")
	assert.True(t, rt.Subnet().Contains(ip), "%s in %s", ip, rt.Subnet())
	assert.Equal(t, "lifecycle", sb.GetLabels()[cri.LabelPodName])

	st, err := c.ContainerStatus(ctx, containerID)
	require.NoError(t, err)
	assert.Equal(t, runtimeapi.ContainerState_CONTAINER_RUNNING, st.GetState())
	assert.Equal(t, "main", st.GetLabels()[cri.LabelContainerName])
	assert.Equal(t, "0", st.GetAnnotations()[cri.AnnotationRestartCount])

	stdout, _, code, err := c.ExecSync(ctx, containerID, []string{"hostname"}, 5*time.Second)
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	assert.Equal(t, "lifecycle\n", string(stdout))
	_, stderr, code, err := c.ExecSync(ctx, containerID, []string{"sh", "-c", "echo oops >&2; exit 3"}, 5*time.Second)
	require.NoError(t, err, "a failing command is a result")
	assert.Equal(t, 3, code)
	assert.Equal(t, "oops\n", string(stderr))
	start := time.Now()
	_, _, _, err = c.ExecSync(ctx, containerID, []string{"sleep", "30"}, time.Second)
	require.ErrorIs(t, err, cri.ErrTimeout)
	assert.Less(t, time.Since(start), 15*time.Second)
	t.Logf("ExecSync timeout reported after %s: %v", time.Since(start).Round(time.Millisecond), err)

	// The container's output went to the kubelet's log path.
	logPath := filepath.Join(logsDir, "nodekit-test_lifecycle_uid-lifecycle", "main", "0.log")
	assert.Eventually(t, func() bool {
		b, _ := os.ReadFile(logPath)
		return strings.Contains(string(b), "started")
	}, 10*time.Second, 100*time.Millisecond, "log %s", logPath)

	require.NoError(t, c.StopContainer(ctx, containerID, time.Second))
	st, err = c.ContainerStatus(ctx, containerID)
	require.NoError(t, err)
	assert.Equal(t, runtimeapi.ContainerState_CONTAINER_EXITED, st.GetState())
	require.NoError(t, c.RemoveContainer(ctx, containerID))
	require.NoError(t, c.StopPodSandbox(ctx, sandboxID))
	require.NoError(t, c.RemovePodSandbox(ctx, sandboxID))
	_, err = c.PodSandboxStatus(ctx, sandboxID)
	require.ErrorIs(t, err, cri.ErrNotFound)
	assert.Contains(t, err.Error(), sandboxID)
}

func TestContainerdErrors(t *testing.T) {
	testenv.RequireLong(t)
	rt := containerd.Start(t, containerd.Options{Registry: true})
	c := connect(t, rt.Endpoint())
	ctx := context.Background()

	t.Run("missing socket", func(t *testing.T) {
		endpoint := "unix://" + filepath.Join(rt.Dir(), "no-such.sock")
		_, err := cri.New(ctx, cri.Config{Endpoint: endpoint})
		require.ErrorIs(t, err, cri.ErrUnavailable)
		assert.Contains(t, err.Error(), "no-such.sock")
		t.Logf("missing socket: %v", err)
	})
	t.Run("image not in registry", func(t *testing.T) {
		image := rt.RegistryHost() + "/nodekit/does-not-exist:1.0"
		_, err := c.PullImage(ctx, image, nil, nil)
		require.Error(t, err)
		assert.Contains(t, err.Error(), `cri PullImage image "`+image+`"`)
		assert.Contains(t, err.Error(), "not found")
		t.Logf("missing image: %v", err)
	})
	t.Run("malformed image name", func(t *testing.T) {
		_, err := c.PullImage(ctx, "Not A/Valid:Name", nil, nil)
		require.Error(t, err)
		assert.Contains(t, err.Error(), `image "Not A/Valid:Name"`)
		t.Logf("malformed image: %v", err)
	})
	t.Run("unknown container", func(t *testing.T) {
		_, err := c.ContainerStatus(ctx, "0123456789abcdef")
		require.ErrorIs(t, err, cri.ErrNotFound)
		assert.Contains(t, err.Error(), `container "0123456789abcdef"`)
	})
}

func TestContainerdNoCNI(t *testing.T) {
	testenv.RequireLong(t)
	rt := containerd.Start(t, containerd.Options{})
	c := connect(t, rt.Endpoint())
	ctx := context.Background()

	ready, err := c.Readiness(ctx)
	require.NoError(t, err)
	assert.False(t, ready.Ready)
	assert.True(t, ready.RuntimeReady)
	assert.Equal(t, "KubeletNotReady", ready.Reason)
	assert.Equal(t, "container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized", ready.Message)

	cfg, err := cri.PodSandboxConfig(busyboxPod("no-cni", rt.BusyboxImage()), cri.PodOptions{LogsDir: t.TempDir()})
	require.NoError(t, err)
	_, err = c.RunPodSandbox(ctx, cfg, "")
	require.Error(t, err)
	assert.Contains(t, err.Error(), `cri RunPodSandbox pod "nodekit-test/no-cni"`)
	assert.Contains(t, err.Error(), "cni plugin not initialized")

	// A host-network pod needs no CNI.
	host := busyboxPod("host-net", rt.BusyboxImage(), "sleep", "3600")
	host.Spec.HostNetwork = true
	_, containerID, _ := startPod(t, c, host, rt.BusyboxImage(), t.TempDir())
	st, err := c.ContainerStatus(ctx, containerID)
	require.NoError(t, err)
	assert.Equal(t, runtimeapi.ContainerState_CONTAINER_RUNNING, st.GetState())
}

// TestContainerdResources checks that ContainerConfig's resources reach the
// container's cgroup (v1 here) through containerd and runc.
func TestContainerdResources(t *testing.T) {
	testenv.RequireLong(t)
	rt := containerd.Start(t, containerd.Options{})
	c := connect(t, rt.Endpoint())
	pod := busyboxPod("limited", rt.BusyboxImage(), "sleep", "3600")
	pod.Spec.HostNetwork = true // no CNI needed
	pod.Spec.Containers[0].Resources = corev1.ResourceRequirements{
		Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("250m")},
		Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("500m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
	}
	_, containerID, _ := startPod(t, c, pod, rt.BusyboxImage(), t.TempDir())
	read := func(path string) string {
		t.Helper()
		stdout, stderr, code, err := c.ExecSync(context.Background(), containerID, []string{"cat", path}, 10*time.Second)
		require.NoError(t, err)
		require.Equal(t, 0, code, "cat %s: %s", path, stderr)
		return strings.TrimSpace(string(stdout))
	}
	assert.Equal(t, "256", read("/sys/fs/cgroup/cpu/cpu.shares"))
	assert.Equal(t, "50000", read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"))
	assert.Equal(t, "100000", read("/sys/fs/cgroup/cpu/cpu.cfs_period_us"))
	assert.Equal(t, strconv.Itoa(64<<20), read("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
}

func TestContainerdRestartRecovery(t *testing.T) {
	testenv.RequireLong(t)
	rt := containerd.Start(t, containerd.Options{CNI: true})
	c := connect(t, rt.Endpoint())
	ctx := context.Background()
	sandboxID, containerID, _ := startPod(t, c, busyboxPod("survivor", rt.BusyboxImage(), "sleep", "3600"), rt.BusyboxImage(), t.TempDir())

	rt.Kill()
	_, err := c.Version(ctx)
	require.ErrorIs(t, err, cri.ErrUnavailable, "calls fail clearly while containerd is down")
	t.Logf("while down: %v", err)

	rt.Restart(t)
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, c.WaitReady(wctx, 50*time.Millisecond))
	t.Logf("client recovered %s after containerd answered again", time.Since(start).Round(time.Millisecond))

	st, err := c.ContainerStatus(ctx, containerID)
	require.NoError(t, err, "the same client works after the restart")
	assert.Equal(t, runtimeapi.ContainerState_CONTAINER_RUNNING, st.GetState(), "the container outlived containerd")
	stdout, _, code, err := c.ExecSync(ctx, containerID, []string{"echo", "back"}, 5*time.Second)
	require.NoError(t, err)
	assert.Equal(t, 0, code)
	assert.Equal(t, "back\n", string(stdout))
	require.NoError(t, c.StopPodSandbox(ctx, sandboxID))
	require.NoError(t, c.RemovePodSandbox(ctx, sandboxID))
}

// TestCrictlInterop checks that crictl v1.37.0 reads the pods nodekit creates the way
// it reads a kubelet's: pod name, namespace and container name from the labels.
func TestCrictlInterop(t *testing.T) {
	testenv.RequireLong(t)
	crictl := containerd.Crictl(t)
	rt := containerd.Start(t, containerd.Options{CNI: true})
	c := connect(t, rt.Endpoint())
	pod := busyboxPod("interop-web", rt.BusyboxImage(), "sleep", "3600")
	sandboxID, containerID, _ := startPod(t, c, pod, rt.BusyboxImage(), t.TempDir())

	run := func(args ...string) []byte {
		t.Helper()
		out, err := exec.Command(crictl, rt.CrictlArgs(args...)...).CombinedOutput()
		require.NoError(t, err, "crictl %v: %s", args, out)
		return out
	}

	var pods struct {
		Items []struct {
			ID       string `json:"id"`
			Metadata struct {
				Name, Namespace, UID string
			} `json:"metadata"`
			State string `json:"state"`
		} `json:"items"`
	}
	require.NoError(t, json.Unmarshal(run("pods", "-o", "json"), &pods))
	require.Len(t, pods.Items, 1)
	assert.Equal(t, sandboxID, pods.Items[0].ID)
	assert.Equal(t, "interop-web", pods.Items[0].Metadata.Name)
	assert.Equal(t, "nodekit-test", pods.Items[0].Metadata.Namespace)
	assert.Equal(t, "uid-interop-web", pods.Items[0].Metadata.UID)
	assert.Equal(t, "SANDBOX_READY", pods.Items[0].State)

	// The filters crictl users type work on nodekit's labels.
	filtered := string(run("pods", "--name", "interop-web", "--namespace", "nodekit-test", "-q"))
	assert.Equal(t, sandboxID, strings.TrimSpace(filtered))

	table := string(run("ps"))
	t.Logf("crictl ps:\n%s", table)
	lines := strings.Split(strings.TrimSpace(table), "\n")
	require.Len(t, lines, 2, "a header and one container")
	assert.Contains(t, lines[0], "POD")
	assert.Contains(t, lines[1], containerID[:13])
	assert.Contains(t, strings.Fields(lines[1]), "main", "container name column")
	assert.Contains(t, strings.Fields(lines[1]), "interop-web", "pod name column, from io.kubernetes.pod.name")
	assert.Contains(t, strings.Fields(lines[1]), "nodekit-test", "namespace column, from io.kubernetes.pod.namespace")

	out := string(run("exec", containerID, "hostname"))
	assert.Equal(t, "interop-web\n", out)
}

func TestContainerdAuthenticatedPull(t *testing.T) {
	testenv.RequireLong(t)
	rt := containerd.Start(t, containerd.Options{RegistryAuth: true})
	c := connect(t, rt.Endpoint())
	ctx := context.Background()
	user, password := rt.RegistryCredentials()
	image := rt.RegistryImage()

	_, err := c.PullImage(ctx, image, nil, nil)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `cri PullImage image "`+image+`"`)
	assert.Contains(t, err.Error(), "401 Unauthorized")
	t.Logf("without credentials: %v", err)

	ref, pulled, err := c.EnsureImage(ctx, image, &runtimeapi.AuthConfig{Username: user, Password: password}, nil)
	require.NoError(t, err)
	assert.True(t, pulled)
	present, err := c.ImagePresent(ctx, image)
	require.NoError(t, err)
	assert.True(t, present)
	again, pulled, err := c.EnsureImage(ctx, image, nil, nil)
	require.NoError(t, err, "a present image needs no credentials")
	assert.False(t, pulled)
	assert.NotEmpty(t, ref)
	assert.NotEmpty(t, again)
}
