package volume_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/nodekit-dev/nodekit/internal/testenv"
	"github.com/nodekit-dev/nodekit/internal/testenv/containerd"
	"github.com/nodekit-dev/nodekit/volume"
	"github.com/nodekit-dev/nodekit/volume/volumetest"
)

// TestMountsInRealContainer hands Mounts' output to a real containerd + runc
// (a host-network pod, so no CNI is involved) and looks from inside the
// container: files are there, read-only volumes refuse writes, an emptyDir is
// shared with the host, a configMap update reaches the mounted folder through
// the ..data swap while a subPath-mounted key keeps its file, and the tmpfs of
// a secret volume is what the container sees.
func TestMountsInRealContainer(t *testing.T) {
	testenv.RequireLong(t)
	requireRoot(t)
	rt := containerd.Start(t, containerd.Options{})
	rs := runtimeapi.NewRuntimeServiceClient(rt.Conn(t))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	sources := volumetest.New(nil,
		configMap("settings", map[string]string{"level": "debug"}),
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "creds"}, Data: map[string][]byte{"password": []byte("hunter2")}},
	)
	root := t.TempDir()
	m, err := volume.New(volume.Config{RootDir: root, Sources: sources})
	require.NoError(t, err)
	pod := newPod(
		cmVol("cfg", "settings"),
		corev1.Volume{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "creds"}}},
		corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	)
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{
		{Name: "cfg", MountPath: "/etc/app"},
		{Name: "cfg", MountPath: "/etc/level", SubPath: "level"},
		{Name: "creds", MountPath: "/var/run/creds"},
		{Name: "scratch", MountPath: "/data"},
		{Name: "scratch", MountPath: "/logs", SubPath: "logs/app"},
	}
	t.Cleanup(func() { _ = m.Teardown(context.Background(), uid) })
	require.NoError(t, m.Setup(ctx, pod))
	mounts, err := m.Mounts(pod, &pod.Spec.Containers[0])
	require.NoError(t, err)

	logs := t.TempDir()
	sbCfg := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: pod.Name, Namespace: pod.Namespace, Uid: string(pod.UID)},
		LogDirectory: logs,
		Linux: &runtimeapi.LinuxPodSandboxConfig{SecurityContext: &runtimeapi.LinuxSandboxSecurityContext{
			NamespaceOptions: &runtimeapi.NamespaceOption{Network: runtimeapi.NamespaceMode_NODE}}},
	}
	sb, err := rs.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: sbCfg})
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = rs.StopPodSandbox(context.Background(), &runtimeapi.StopPodSandboxRequest{PodSandboxId: sb.PodSandboxId})
		_, _ = rs.RemovePodSandbox(context.Background(), &runtimeapi.RemovePodSandboxRequest{PodSandboxId: sb.PodSandboxId})
	})
	ctr, err := rs.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: sb.PodSandboxId, SandboxConfig: sbCfg,
		Config: &runtimeapi.ContainerConfig{
			Metadata: &runtimeapi.ContainerMetadata{Name: "app"},
			Image:    &runtimeapi.ImageSpec{Image: rt.BusyboxImage()},
			Command:  []string{"sleep", "3600"},
			LogPath:  "app.log",
			Mounts:   mounts,
		}})
	require.NoError(t, err)
	_, err = rs.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: ctr.ContainerId})
	require.NoError(t, err)

	sh := func(script string) (string, int32) {
		t.Helper()
		r, err := rs.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: ctr.ContainerId, Cmd: []string{"sh", "-c", script}, Timeout: 10})
		require.NoError(t, err)
		return strings.TrimSpace(string(r.Stdout) + string(r.Stderr)), r.ExitCode
	}
	out, code := sh("cat /etc/app/level /etc/level /var/run/creds/password")
	assert.Zero(t, code, out)
	assert.Equal(t, "debugdebughunter2", strings.ReplaceAll(out, "\n", ""))

	out, code = sh("touch /etc/app/new")
	assert.NotZero(t, code, "configMap volumes are read-only: %s", out)
	assert.Contains(t, out, "Read-only file system")
	_, code = sh("touch /var/run/creds/new")
	assert.NotZero(t, code, "secret volumes are read-only")

	out, code = sh("grep ' /var/run/creds ' /proc/mounts")
	assert.Zero(t, code)
	assert.Contains(t, out, "tmpfs", "the secret is on tmpfs inside the container too")

	_, code = sh("echo from-container > /data/out && echo log-line > /logs/app.log")
	assert.Zero(t, code)
	scratch := filepath.Join(root, "pods", uid, "volumes", "kubernetes.io~empty-dir", "scratch")
	assert.Equal(t, "from-container\n", read(t, filepath.Join(scratch, "out")))
	assert.Equal(t, "log-line\n", read(t, filepath.Join(scratch, "logs/app/app.log")), "the subPath folder was created inside the volume")

	// A configMap update: the folder mount follows, the subPath file does not.
	sources.Add(configMap("settings", map[string]string{"level": "info"}))
	require.NoError(t, m.Setup(ctx, pod))
	out, _ = sh("cat /etc/app/level; echo; cat /etc/level")
	assert.Equal(t, "info\ndebug", out)

	// An escape attempt from inside: the container swaps the subPath folder
	// for a symlink to /; a new Mounts (the next container start) refuses it.
	_, code = sh("mv /data/logs /data/logs.old && ln -s / /data/logs")
	require.Zero(t, code)
	_, err = m.Mounts(pod, &pod.Spec.Containers[0])
	assert.ErrorIs(t, err, volume.ErrInvalidSubPath)
	entries, err := os.ReadDir(filepath.Join(scratch, "logs.old", "app"))
	require.NoError(t, err)
	assert.Len(t, entries, 1)
}
