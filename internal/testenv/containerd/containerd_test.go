package containerd_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/containerd"
)

func sandboxConfig(name string, hostNetwork bool) *runtimeapi.PodSandboxConfig {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	uid := hex.EncodeToString(b)
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata: &runtimeapi.PodSandboxMetadata{Name: name, Namespace: "harness", Uid: uid},
		Labels: map[string]string{
			"io.kubernetes.pod.name":      name,
			"io.kubernetes.pod.namespace": "harness",
			"io.kubernetes.pod.uid":       uid,
		},
		LogDirectory: "",
		Linux:        &runtimeapi.LinuxPodSandboxConfig{},
	}
	if hostNetwork {
		cfg.Linux.SecurityContext = &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE},
		}
	} else {
		cfg.Hostname = name
	}
	return cfg
}

func condition(t *testing.T, st *runtimeapi.RuntimeStatus, typ string) *runtimeapi.RuntimeCondition {
	t.Helper()
	for _, c := range st.GetConditions() {
		if c.GetType() == typ {
			return c
		}
	}
	t.Fatalf("runtime status has no %s condition: %v", typ, st)
	return nil
}

func TestWithCNI(t *testing.T) {
	testenv.RequireLong(t)
	c := containerd.Start(t, containerd.Options{CNI: true})
	rs := runtimeapi.NewRuntimeServiceClient(c.Conn(t))
	is := runtimeapi.NewImageServiceClient(c.Conn(t))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	assert.True(t, strings.HasPrefix(c.Endpoint(), "unix:///"), c.Endpoint())
	v, err := rs.Version(ctx, &runtimeapi.VersionRequest{})
	require.NoError(t, err)
	assert.Equal(t, "containerd", v.GetRuntimeName())

	st, err := rs.Status(ctx, &runtimeapi.StatusRequest{})
	require.NoError(t, err)
	assert.True(t, condition(t, st.GetStatus(), runtimeapi.RuntimeReady).GetStatus())
	assert.True(t, condition(t, st.GetStatus(), runtimeapi.NetworkReady).GetStatus())

	for _, img := range []string{c.PauseImage(), c.BusyboxImage()} {
		resp, err := is.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: img}})
		require.NoError(t, err)
		assert.NotNil(t, resp.GetImage(), "image %s should be imported", img)
	}

	cfg := sandboxConfig("cni-pod", false)
	run, err := rs.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	require.NoError(t, err)
	ps, err := rs.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: run.GetPodSandboxId()})
	require.NoError(t, err)
	ip := net.ParseIP(ps.GetStatus().GetNetwork().GetIp())
	require.NotNil(t, ip, "sandbox has no IP: %v", ps.GetStatus().GetNetwork())
	assert.True(t, c.Subnet().Contains(ip), "sandbox IP %s outside the run's subnet %s", ip, c.Subnet())

	// A container in it runs busybox for real.
	created, err := rs.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
		PodSandboxId:  run.GetPodSandboxId(),
		SandboxConfig: cfg,
		Config: &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: "sleeper"},
			Image:    &runtimeapi.ImageSpec{Image: c.BusyboxImage()},
			Command:  []string{"sleep", "3600"},
			Linux:    &runtimeapi.LinuxContainerConfig{},
		},
	})
	require.NoError(t, err)
	_, err = rs.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: created.GetContainerId()})
	require.NoError(t, err)
	exec, err := rs.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: created.GetContainerId(), Cmd: []string{"hostname"}, Timeout: 10})
	require.NoError(t, err)
	assert.Equal(t, int32(0), exec.GetExitCode())
	assert.Equal(t, "cni-pod\n", string(exec.GetStdout()))
}

func TestWithoutCNI(t *testing.T) {
	testenv.RequireLong(t)
	c := containerd.Start(t, containerd.Options{})
	rs := runtimeapi.NewRuntimeServiceClient(c.Conn(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	st, err := rs.Status(ctx, &runtimeapi.StatusRequest{})
	require.NoError(t, err)
	assert.True(t, condition(t, st.GetStatus(), runtimeapi.RuntimeReady).GetStatus())
	network := condition(t, st.GetStatus(), runtimeapi.NetworkReady)
	assert.False(t, network.GetStatus())
	assert.Equal(t, "NetworkPluginNotReady", network.GetReason())
	assert.Equal(t, "Network plugin returns error: cni plugin not initialized", network.GetMessage())

	_, err = rs.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sandboxConfig("no-cni", false)})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cni plugin not initialized")

	// The host network needs no CNI.
	run, err := rs.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sandboxConfig("host-net", true)})
	require.NoError(t, err)
	assert.NotEmpty(t, run.GetPodSandboxId())
}

func TestRegistryAndRestart(t *testing.T) {
	testenv.RequireLong(t)
	c := containerd.Start(t, containerd.Options{Registry: true})
	require.NotEmpty(t, c.RegistryHost())
	is := runtimeapi.NewImageServiceClient(c.Conn(t))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	pulled, err := is.PullImage(ctx, &runtimeapi.PullImageRequest{Image: &runtimeapi.ImageSpec{Image: c.RegistryImage()}})
	require.NoError(t, err, "pull %s", c.RegistryImage())
	assert.NotEmpty(t, pulled.GetImageRef())

	c.Kill()
	_, err = os.Stat(c.Address())
	require.NoError(t, err, "a killed containerd leaves its socket behind")
	c.Restart(t)
	resp, err := is.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: c.RegistryImage()}})
	require.NoError(t, err, "CRI answers again on the same connection after the restart")
	assert.NotNil(t, resp.GetImage(), "the pulled image survives the restart")
}

// TestKilledRunIsCleanedUp kills containerd with a pod running and never restarts it:
// the cleanup must still stop the pod (no pause process left behind).
func TestKilledRunIsCleanedUp(t *testing.T) {
	testenv.RequireLong(t)
	var pausePID string
	ran := t.Run("run", func(t *testing.T) {
		c := containerd.Start(t, containerd.Options{CNI: true})
		rs := runtimeapi.NewRuntimeServiceClient(c.Conn(t))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		run, err := rs.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sandboxConfig("orphan", false)})
		require.NoError(t, err)
		st, err := rs.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: run.GetPodSandboxId(), Verbose: true})
		require.NoError(t, err)
		info := st.GetInfo()["info"]
		i := strings.Index(info, `"pid":`)
		require.GreaterOrEqual(t, i, 0, "verbose status has the pause pid: %s", info)
		pausePID = strings.TrimSpace(strings.SplitN(strings.SplitN(info[i+6:], ",", 2)[0], "}", 2)[0])
		_, err = os.Stat("/proc/" + pausePID)
		require.NoError(t, err, "pause process %s runs", pausePID)
		c.Kill()
	})
	if !ran || pausePID == "" {
		return // the run failed or was skipped (prerequisites): nothing to check
	}
	_, err := os.Stat("/proc/" + pausePID)
	assert.True(t, os.IsNotExist(err), "pause process %s outlived the cleanup", pausePID)
}

func TestRegistryAuth(t *testing.T) {
	testenv.RequireLong(t)
	c := containerd.Start(t, containerd.Options{RegistryAuth: true})
	user, password := c.RegistryCredentials()
	require.NotEmpty(t, user)
	is := runtimeapi.NewImageServiceClient(c.Conn(t))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	image := &runtimeapi.ImageSpec{Image: c.RegistryImage()}

	_, err := is.PullImage(ctx, &runtimeapi.PullImageRequest{Image: image})
	require.Error(t, err, "a pull without credentials is refused")
	assert.Contains(t, err.Error(), "401")
	_, err = is.PullImage(ctx, &runtimeapi.PullImageRequest{Image: image, Auth: &runtimeapi.AuthConfig{Username: user, Password: "wrong"}})
	require.Error(t, err, "a pull with a wrong password is refused")
	pulled, err := is.PullImage(ctx, &runtimeapi.PullImageRequest{Image: image, Auth: &runtimeapi.AuthConfig{Username: user, Password: password}})
	require.NoError(t, err)
	assert.NotEmpty(t, pulled.GetImageRef())
}

// imageMountContainer creates and starts, in a new host-network sandbox, a busybox
// container with the busybox image itself mounted read-only at /vol (its bin folder
// alone with subPath), and returns what ls shows there, or CreateContainer's error.
func imageMountContainer(ctx context.Context, t *testing.T, c *containerd.Containerd, name, subPath string) (string, error) {
	t.Helper()
	rs := runtimeapi.NewRuntimeServiceClient(c.Conn(t))
	is := runtimeapi.NewImageServiceClient(c.Conn(t))
	img, err := is.ImageStatus(ctx, &runtimeapi.ImageStatusRequest{Image: &runtimeapi.ImageSpec{Image: c.BusyboxImage()}})
	require.NoError(t, err)
	cfg := sandboxConfig(name, true)
	run, err := rs.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	require.NoError(t, err)
	created, err := rs.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{
		PodSandboxId:  run.GetPodSandboxId(),
		SandboxConfig: cfg,
		Config: &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: "reader"},
			Image:    &runtimeapi.ImageSpec{Image: c.BusyboxImage()},
			Command:  []string{"sleep", "3600"},
			Linux:    &runtimeapi.LinuxContainerConfig{},
			Mounts: []*runtimeapi.Mount{{
				ContainerPath: "/vol", Readonly: true, ImageSubPath: subPath,
				Image: &runtimeapi.ImageSpec{Image: img.GetImage().GetId(), UserSpecifiedImage: c.BusyboxImage()},
			}},
		},
	})
	if err != nil {
		return "", err
	}
	_, err = rs.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: created.GetContainerId()})
	require.NoError(t, err)
	// The status names the mounted image by ID: what an image GC must count as in use
	// (upstream's handleImageVolumes).
	st, err := rs.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: created.GetContainerId()})
	require.NoError(t, err)
	var mounted []string
	for _, m := range st.GetStatus().GetMounts() {
		if m.GetImage() != nil {
			mounted = append(mounted, m.GetImage().GetImage())
		}
	}
	assert.Equal(t, []string{img.GetImage().GetId()}, mounted, "ContainerStatus.mounts carries the image mount")
	out, err := rs.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: created.GetContainerId(), Cmd: []string{"ls", "/vol"}, Timeout: 10})
	require.NoError(t, err)
	require.Equal(t, int32(0), out.GetExitCode(), "ls /vol: %s", out.GetStderr())
	w, err := rs.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: created.GetContainerId(), Cmd: []string{"touch", "/vol/new"}, Timeout: 10})
	require.NoError(t, err)
	assert.NotEqual(t, int32(0), w.GetExitCode(), "an image mount is read-only")
	return string(out.GetStdout()), nil
}

func TestV2ImageMounts(t *testing.T) {
	testenv.RequireLong(t)
	c := containerd.Start(t, containerd.Options{BinDir: containerd.V2Dir(t)})
	rs := runtimeapi.NewRuntimeServiceClient(c.Conn(t))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	v, err := rs.Version(ctx, &runtimeapi.VersionRequest{})
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(v.GetRuntimeVersion(), "v2."), "containerd 2.x runs: %s", v.GetRuntimeVersion())

	whole, err := imageMountContainer(ctx, t, c, "image-mount", "")
	require.NoError(t, err)
	assert.Contains(t, strings.Fields(whole), "bin", "the image's root is mounted")
	assert.Contains(t, strings.Fields(whole), "etc")
	sub, err := imageMountContainer(ctx, t, c, "image-subpath", "bin")
	require.NoError(t, err)
	assert.Contains(t, strings.Fields(sub), "sh", "subPath mounts the image's bin folder")
}

func TestV1ImageMountsUnsupported(t *testing.T) {
	testenv.RequireLong(t)
	c := containerd.Start(t, containerd.Options{})
	if v := runtimeVersion(t, c); !strings.HasPrefix(v, "1.6") {
		t.Skipf("the machine's containerd is %s, not 1.6", v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Debian's containerd 1.6 does not know the field: it takes the mount for a
	// bind mount of an empty host path. Why the kubelet checks the version first.
	_, err := imageMountContainer(ctx, t, c, "image-mount", "")
	require.Error(t, err)
	assert.Contains(t, err.Error(), `failed to mkdir "": mkdir : no such file or directory`)
}

func runtimeVersion(t *testing.T, c *containerd.Containerd) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	v, err := runtimeapi.NewRuntimeServiceClient(c.Conn(t)).Version(ctx, &runtimeapi.VersionRequest{})
	require.NoError(t, err)
	return v.GetRuntimeVersion()
}

// Two containerd 2.x side by side, as nodekit up's nodes and parallel tests run them:
// each serves CRI and runs a container, and neither takes the machine-wide NRI socket
// nor migrates its configuration.
func TestV2SideBySide(t *testing.T) {
	testenv.RequireLong(t)
	dir := containerd.V2Dir(t)
	nriBefore, errBefore := os.Stat("/var/run/nri/nri.sock")
	var cs []*containerd.Containerd
	for range 2 {
		cs = append(cs, containerd.Start(t, containerd.Options{BinDir: dir}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i, c := range cs {
		out, err := imageMountContainer(ctx, t, c, fmt.Sprintf("side-%d", i), "")
		require.NoError(t, err, "containerd %d", i)
		assert.Contains(t, strings.Fields(out), "bin", "containerd %d ran a container", i)
		// The configuration is in the layout this containerd reads as written.
		log, err := os.ReadFile(c.LogPath())
		require.NoError(t, err)
		for line := range strings.Lines(string(log)) {
			assert.NotContains(t, line, "Configuration migrated from version", "containerd %d", i)
		}
	}
	nriAfter, errAfter := os.Stat("/var/run/nri/nri.sock")
	if errBefore != nil {
		assert.True(t, os.IsNotExist(errAfter), "a test containerd made /var/run/nri/nri.sock: NRI must be off")
	} else if errAfter == nil {
		assert.Equal(t, nriBefore.ModTime(), nriAfter.ModTime(), "a test containerd replaced /var/run/nri/nri.sock: NRI must be off")
	}
}
