package volume_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/nodekit-dev/nodekit/volume"
	"github.com/nodekit-dev/nodekit/volume/volumetest"
)

const uid = "5c0f3e2a-1111-2222-3333-444455556666"

var start = time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC)

func newPod(vols ...corev1.Volume) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "shop", Name: "cart-0", UID: uid,
			Labels:      map[string]string{"app": "cart", "tier": "web"},
			Annotations: map[string]string{"build": "42"},
		},
		Spec: corev1.PodSpec{
			ServiceAccountName: "cart",
			Volumes:            vols,
			Containers: []corev1.Container{{Name: "app", Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{"cpu": resource.MustParse("250m")},
				Limits:   corev1.ResourceList{"memory": resource.MustParse("64Mi")},
			}}},
		},
	}
}

type env struct {
	root    string
	clock   *clocktesting.FakeClock
	sources *volumetest.Sources
	mounter *volumetest.RecordingMounter
	m       *volume.Manager
}

func newEnv(t *testing.T, objs ...any) *env {
	t.Helper()
	e := &env{root: t.TempDir(), clock: clocktesting.NewFakeClock(start), mounter: &volumetest.RecordingMounter{}}
	e.sources = volumetest.New(e.clock, objs...)
	m, err := volume.New(volume.Config{
		RootDir: e.root, Sources: e.sources, Clock: e.clock, Mounter: e.mounter,
		NodeAllocatable: corev1.ResourceList{"cpu": resource.MustParse("4"), "memory": resource.MustParse("8Gi")},
	})
	require.NoError(t, err)
	e.m = m
	return e
}

func (e *env) dir(plugin, name string) string {
	return filepath.Join(e.root, "pods", uid, "volumes", "kubernetes.io~"+plugin, name)
}

func read(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(data)
}

func mode(t *testing.T, path string) os.FileMode {
	t.Helper()
	st, err := os.Stat(path)
	require.NoError(t, err)
	return st.Mode()
}

func cmVol(name, cm string, items ...corev1.KeyToPath) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
		LocalObjectReference: corev1.LocalObjectReference{Name: cm}, Items: items}}}
}

func configMap(name string, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: name}, Data: data}
}

func TestEmptyDirOnDisk(t *testing.T) {
	e := newEnv(t)
	pod := newPod(corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	require.NoError(t, e.m.Setup(context.Background(), pod))
	dir := e.dir("empty-dir", "scratch")
	assert.Equal(t, os.ModeDir|0o777, mode(t, dir))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "keep"), []byte("x"), 0o644))
	require.NoError(t, e.m.Setup(context.Background(), pod), "Setup again")
	assert.Equal(t, "x", read(t, filepath.Join(dir, "keep")), "Setup again keeps the contents")
	assert.Empty(t, e.mounter.Calls())
}

func TestEmptyDirMemorySize(t *testing.T) {
	for _, tc := range []struct {
		name      string
		sizeLimit string
		podLimit  bool
		want      string
	}{
		{name: "no limits: node allocatable", want: "mount tmpfs"},
		{name: "container limits: the pod's", podLimit: true, want: "mount tmpfs"},
		{name: "a smaller sizeLimit wins", sizeLimit: "16Mi", podLimit: true},
		{name: "a sizeLimit above the pod limit is ignored", sizeLimit: "1Gi", podLimit: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			src := &corev1.EmptyDirVolumeSource{Medium: corev1.StorageMediumMemory}
			if tc.sizeLimit != "" {
				src.SizeLimit = ptr.To(resource.MustParse(tc.sizeLimit))
			}
			pod := newPod(corev1.Volume{Name: "shm", VolumeSource: corev1.VolumeSource{EmptyDir: src}})
			if !tc.podLimit {
				pod.Spec.Containers[0].Resources.Limits = nil
			}
			sizes := &sizeRecorder{RecordingMounter: e.mounter}
			m, err := volume.New(volume.Config{RootDir: e.root, Mounter: sizes,
				NodeAllocatable: corev1.ResourceList{"memory": resource.MustParse("8Gi")}})
			require.NoError(t, err)
			require.NoError(t, m.Setup(context.Background(), pod))
			require.NoError(t, m.Setup(context.Background(), pod))
			want := map[string]int64{
				"no limits: node allocatable":                8 << 30,
				"container limits: the pod's":                64 << 20,
				"a smaller sizeLimit wins":                   16 << 20,
				"a sizeLimit above the pod limit is ignored": 64 << 20,
			}[tc.name]
			assert.Equal(t, []int64{want}, sizes.sizes, "one tmpfs mount, sized like the kubelet's")
		})
	}
}

type sizeRecorder struct {
	*volumetest.RecordingMounter
	sizes []int64
}

func (s *sizeRecorder) MountTmpfs(target string, size int64) error {
	s.sizes = append(s.sizes, size)
	return s.RecordingMounter.MountTmpfs(target, size)
}

func TestEmptyDirMemoryRealTmpfs(t *testing.T) {
	requireRoot(t)
	root := t.TempDir()
	m, err := volume.New(volume.Config{RootDir: root})
	require.NoError(t, err)
	pod := newPod(corev1.Volume{Name: "shm", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
		Medium: corev1.StorageMediumMemory, SizeLimit: ptr.To(resource.MustParse("8Mi"))}}})
	ctx := context.Background()
	t.Cleanup(func() { _ = m.Teardown(ctx, uid) })
	require.NoError(t, m.Setup(ctx, pod))
	require.NoError(t, m.Setup(ctx, pod), "Setup again does not stack a second tmpfs")
	dir := filepath.Join(root, "pods", uid, "volumes", "kubernetes.io~empty-dir", "shm")
	var st unixStatfs
	require.NoError(t, statfs(dir, &st))
	assert.Equal(t, int64(tmpfsMagic), int64(st.Type), "a tmpfs is mounted")
	assert.Equal(t, int64(8<<20), int64(st.Blocks)*int64(st.Bsize), "sized by sizeLimit")
	assert.Equal(t, 1, countMounts(t, dir))

	require.NoError(t, m.Teardown(ctx, uid))
	assert.Equal(t, 0, countMounts(t, dir))
	_, err = os.Stat(filepath.Join(root, "pods", uid, "volumes"))
	assert.True(t, os.IsNotExist(err), "volumes folder removed")
}

func TestHostPathTypes(t *testing.T) {
	e := newEnv(t)
	base := t.TempDir()
	dir := filepath.Join(base, "dir")
	fileP := filepath.Join(base, "file")
	sock := filepath.Join(base, "sock")
	require.NoError(t, os.Mkdir(dir, 0o700))
	require.NoError(t, os.WriteFile(fileP, nil, 0o600))
	l, err := net.Listen("unix", sock)
	require.NoError(t, err)
	defer l.Close()

	absent := filepath.Join(base, "absent")
	for _, tc := range []struct {
		path string
		typ  corev1.HostPathType
		err  string
	}{
		{dir, "", ""},
		{absent, corev1.HostPathUnset, ""},
		{dir, corev1.HostPathDirectory, ""},
		{fileP, corev1.HostPathDirectory, "hostPath type check failed: " + fileP + " is not a directory, it's a File"},
		{absent, corev1.HostPathDirectory, "hostPath type check failed, " + absent + " is not a directory, unable to determine its type: path \"" + absent + "\" does not exist"},
		{filepath.Join(base, "made/deep"), corev1.HostPathDirectoryOrCreate, ""},
		{fileP, corev1.HostPathDirectoryOrCreate, "hostPath type check failed: " + fileP + " is not a directory, it's a File"},
		{fileP, corev1.HostPathFile, ""},
		{dir, corev1.HostPathFile, "hostPath type check failed: " + dir + " is not a file, it's a Directory"},
		{filepath.Join(base, "newfile"), corev1.HostPathFileOrCreate, ""},
		{sock, corev1.HostPathSocket, ""},
		{fileP, corev1.HostPathSocket, "hostPath type check failed: " + fileP + " is not a socket file, it's a File"},
		{"/dev/null", corev1.HostPathCharDev, ""},
		{sock, corev1.HostPathCharDev, "hostPath type check failed: " + sock + " is not a character device, it's a Socket"},
		{"/dev/null", corev1.HostPathBlockDev, "hostPath type check failed: /dev/null is not a block device, it's a CharDevice"},
		{dir, "Weird", "Weird is an invalid volume type"},
	} {
		pod := newPod(corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: tc.path, Type: ptr.To(tc.typ)}}})
		err := e.m.Setup(context.Background(), pod)
		if tc.err == "" {
			assert.NoError(t, err, "%s %s", tc.typ, tc.path)
			continue
		}
		require.Error(t, err, "%s %s", tc.typ, tc.path)
		assert.Equal(t, `MountVolume.SetUp failed for volume "host" : `+tc.err, err.Error())
		assert.ErrorIs(t, err, volume.ErrSetup)
		assert.ErrorIs(t, err, volume.ErrHostPathType)
	}
	err = e.m.Setup(context.Background(), newPod(corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: base + "/../etc"}}}))
	require.Error(t, err)
	assert.Equal(t, "MountVolume.SetUp failed for volume \"host\" : invalid HostPath `"+base+"/../etc`: must not contain '..'", err.Error())
	assert.DirExists(t, filepath.Join(base, "made/deep"))
	assert.Equal(t, os.FileMode(0o755), mode(t, filepath.Join(base, "made/deep")).Perm())
	assert.FileExists(t, filepath.Join(base, "newfile"))
	assert.Equal(t, os.FileMode(0o644), mode(t, filepath.Join(base, "newfile")).Perm())
}

func TestConfigMap(t *testing.T) {
	e := newEnv(t, configMap("settings", map[string]string{"level": "debug", "region": "eu"}))
	ctx := context.Background()
	pod := newPod(
		cmVol("all", "settings"),
		cmVol("some", "settings", corev1.KeyToPath{Key: "level", Path: "conf/level.txt", Mode: ptr.To[int32](0o600)}, corev1.KeyToPath{Key: "region", Path: "region"}),
	)
	pod.Spec.Volumes[1].ConfigMap.DefaultMode = ptr.To[int32](0o440)
	require.NoError(t, e.m.Setup(ctx, pod))

	all := e.dir("configmap", "all")
	assert.Equal(t, "debug", read(t, filepath.Join(all, "level")))
	assert.Equal(t, "eu", read(t, filepath.Join(all, "region")))
	assert.Equal(t, os.FileMode(0o644), mode(t, filepath.Join(all, "level")).Perm(), "defaultMode 0644")
	assert.Equal(t, os.ModeDir|0o777, mode(t, all))
	link, err := os.Readlink(filepath.Join(all, "level"))
	require.NoError(t, err)
	assert.Equal(t, "..data/level", link)

	some := e.dir("configmap", "some")
	assert.Equal(t, "debug", read(t, filepath.Join(some, "conf/level.txt")))
	assert.Equal(t, os.FileMode(0o600), mode(t, filepath.Join(some, "conf/level.txt")).Perm())
	assert.Equal(t, os.FileMode(0o440), mode(t, filepath.Join(some, "region")).Perm())
	_, err = os.Lstat(filepath.Join(some, "level"))
	assert.True(t, os.IsNotExist(err), "items project only what they name")

	// An update reaches the files on the next Setup, the way the kubelet's
	// periodic remount does; a removed key disappears.
	e.sources.Add(configMap("settings", map[string]string{"level": "info"}))
	err = e.m.Setup(ctx, pod)
	assert.Equal(t, "info", read(t, filepath.Join(all, "level")))
	_, statErr := os.Lstat(filepath.Join(all, "region"))
	assert.True(t, os.IsNotExist(statErr))
	require.Error(t, err, "the items volume names a key that is gone")
	assert.Equal(t, `MountVolume.SetUp failed for volume "some" : configmap references non-existent config key: region`, err.Error())
	assert.Equal(t, "debug", read(t, filepath.Join(some, "conf/level.txt")), "a failed refresh keeps the last good files")
}

func TestConfigMapMissingAndOptional(t *testing.T) {
	e := newEnv(t, configMap("partial", map[string]string{"a": "1"}))
	ctx := context.Background()
	opt := cmVol("opt", "absent")
	opt.ConfigMap.Optional = ptr.To(true)
	optKey := cmVol("optkey", "partial", corev1.KeyToPath{Key: "a", Path: "a"}, corev1.KeyToPath{Key: "b", Path: "b"})
	optKey.ConfigMap.Optional = ptr.To(true)
	pod := newPod(cmVol("cfg", "absent"), opt, optKey,
		corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	err := e.m.Setup(ctx, pod)
	require.Error(t, err)
	assert.Equal(t, `MountVolume.SetUp failed for volume "cfg" : configmap "absent" not found`, err.Error())
	var se *volume.SetupError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, "cfg", se.Volume)

	// The other volumes are there all the same.
	assert.DirExists(t, e.dir("empty-dir", "scratch"))
	entries, err := os.ReadDir(e.dir("configmap", "opt"))
	require.NoError(t, err)
	assert.Len(t, entries, 2, "an optional missing configMap is an empty volume (..data and its folder)")
	assert.Equal(t, "1", read(t, filepath.Join(e.dir("configmap", "optkey"), "a")))
	assert.NoFileExists(t, filepath.Join(e.dir("configmap", "optkey"), "b"))
}

func TestSecretAndDownwardAPIOnTmpfs(t *testing.T) {
	e := newEnv(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "creds"}, Data: map[string][]byte{"password": []byte("hunter2")}})
	ctx := context.Background()
	pod := newPod(
		corev1.Volume{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "creds"}}},
		corev1.Volume{Name: "missing", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "nope"}}},
		corev1.Volume{Name: "badkey", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "creds", Items: []corev1.KeyToPath{{Key: "user", Path: "user"}}}}},
		corev1.Volume{Name: "info", VolumeSource: corev1.VolumeSource{DownwardAPI: &corev1.DownwardAPIVolumeSource{Items: []corev1.DownwardAPIVolumeFile{
			{Path: "labels", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.labels"}},
			{Path: "name", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}},
			{Path: "build", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.annotations['build']"}, Mode: ptr.To[int32](0o400)},
			{Path: "cpu_m", ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "app", Resource: "requests.cpu", Divisor: resource.MustParse("1m")}},
			{Path: "mem_limit", ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "app", Resource: "limits.memory"}},
			{Path: "cpu_limit", ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "app", Resource: "limits.cpu"}},
		}}}},
	)
	err := e.m.Setup(ctx, pod)
	require.Error(t, err)
	assert.Equal(t, `MountVolume.SetUp failed for volume "missing" : secret "nope" not found`+"\n"+
		`MountVolume.SetUp failed for volume "badkey" : references non-existent secret key: user`, err.Error())

	creds := e.dir("secret", "creds")
	assert.Equal(t, "hunter2", read(t, filepath.Join(creds, "password")))
	info := e.dir("downward-api", "info")
	assert.Equal(t, "app=\"cart\"\ntier=\"web\"", read(t, filepath.Join(info, "labels")))
	assert.Equal(t, "cart-0", read(t, filepath.Join(info, "name")))
	assert.Equal(t, "42", read(t, filepath.Join(info, "build")))
	assert.Equal(t, os.FileMode(0o400), mode(t, filepath.Join(info, "build")).Perm())
	assert.Equal(t, "250", read(t, filepath.Join(info, "cpu_m")))
	assert.Equal(t, "67108864", read(t, filepath.Join(info, "mem_limit")))
	assert.Equal(t, "4", read(t, filepath.Join(info, "cpu_limit")), "unset limit defaults to node allocatable")

	// Secrets and downward API files live on tmpfs, as the kubelet's, so they never touch the disk.
	calls := strings.Join(e.mounter.Calls(), "\n")
	assert.Contains(t, calls, "mount tmpfs "+creds)
	assert.Contains(t, calls, "mount tmpfs "+info)

	// A label change reaches the downward API file on the next Setup.
	pod.Labels["tier"] = "api"
	_ = e.m.Setup(ctx, pod)
	assert.Equal(t, "app=\"cart\"\ntier=\"api\"", read(t, filepath.Join(info, "labels")))
	assert.Equal(t, 1, strings.Count(strings.Join(e.mounter.Calls(), "\n"), "mount tmpfs "+info), "no second tmpfs on refresh")
}

func tokenVolume(expiration int64) corev1.Volume {
	return corev1.Volume{Name: "kube-api-access", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		DefaultMode: ptr.To[int32](0o644),
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: ptr.To(expiration), Audience: "vault"}},
			{ConfigMap: &corev1.ConfigMapProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"}, Items: []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
			{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
		},
	}}}
}

func TestProjectedTokenRotation(t *testing.T) {
	e := newEnv(t,
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart"}},
		configMap("kube-root-ca.crt", map[string]string{"ca.crt": "PEM"}),
	)
	ctx := context.Background()
	pod := newPod(tokenVolume(3600))
	require.NoError(t, e.m.Setup(ctx, pod))
	dir := e.dir("projected", "kube-api-access")
	assert.Equal(t, "token-1", read(t, filepath.Join(dir, "token")))
	assert.Equal(t, "PEM", read(t, filepath.Join(dir, "ca.crt")))
	assert.Equal(t, "shop", read(t, filepath.Join(dir, "namespace")))
	assert.Equal(t, os.FileMode(0o644), mode(t, filepath.Join(dir, "token")).Perm())

	reqs := e.sources.TokenRequests()
	require.Len(t, reqs, 1)
	assert.Equal(t, authenticationv1.TokenRequestSpec{
		Audiences:         []string{"vault"},
		ExpirationSeconds: ptr.To[int64](3600),
		BoundObjectRef:    &authenticationv1.BoundObjectReference{APIVersion: "v1", Kind: "Pod", Name: "cart-0", UID: uid},
	}, reqs[0].Spec)

	// 78% of the TTL: the cached token is still good (the jitter moves the
	// refresh at most 10s earlier than the 80% mark, 2880s).
	e.clock.SetTime(start.Add(2808 * time.Second))
	require.NoError(t, e.m.Setup(ctx, pod))
	assert.Equal(t, "token-1", read(t, filepath.Join(dir, "token")))
	assert.Len(t, e.sources.TokenRequests(), 1)

	// Past 80%: a new token is requested and swapped in atomically.
	e.clock.SetTime(start.Add(2881 * time.Second))
	require.NoError(t, e.m.Setup(ctx, pod))
	assert.Equal(t, "token-2", read(t, filepath.Join(dir, "token")))
	assert.Len(t, e.sources.TokenRequests(), 2)

	// The API server refuses a refresh: the unexpired token stays in use...
	e.sources.TokenErr = errors.New("apiserver unreachable")
	e.clock.SetTime(start.Add(2881*time.Second + 2900*time.Second))
	require.NoError(t, e.m.Setup(ctx, pod))
	assert.Equal(t, "token-2", read(t, filepath.Join(dir, "token")))
	// ...until it expires: then Setup fails and the file is left as it was.
	e.clock.SetTime(start.Add(2881*time.Second + 3601*time.Second))
	err := e.m.Setup(ctx, pod)
	require.Error(t, err)
	assert.Equal(t, `MountVolume.SetUp failed for volume "kube-api-access" : token "cart"/"shop"/[]string{"vault"}/3600/v1.BoundObjectReference{Kind:"Pod", APIVersion:"v1", Name:"cart-0", UID:"`+uid+`"}/"" expired and refresh failed: apiserver unreachable`, err.Error())
}

func TestProjectedTokenMaxAge(t *testing.T) {
	e := newEnv(t, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart"}},
		configMap("kube-root-ca.crt", map[string]string{"ca.crt": "PEM"}))
	ctx := context.Background()
	pod := newPod(tokenVolume(7 * 24 * 3600)) // a week-long token
	require.NoError(t, e.m.Setup(ctx, pod))
	e.clock.SetTime(start.Add(23*time.Hour + 59*time.Minute))
	require.NoError(t, e.m.Setup(ctx, pod))
	assert.Len(t, e.sources.TokenRequests(), 1, "younger than 24h: kept")
	e.clock.SetTime(start.Add(24*time.Hour + time.Second))
	require.NoError(t, e.m.Setup(ctx, pod))
	assert.Len(t, e.sources.TokenRequests(), 2, "older than 24h: refreshed although far from expiry")
}

func TestProjectedErrorsAndFsGroup(t *testing.T) {
	e := newEnv(t, configMap("kube-root-ca.crt", map[string]string{"ca.crt": "PEM"}))
	ctx := context.Background()
	pod := newPod(tokenVolume(3600))
	err := e.m.Setup(ctx, pod)
	require.Error(t, err)
	assert.Equal(t, `MountVolume.SetUp failed for volume "kube-api-access" : failed to fetch token: serviceaccounts "cart" not found`, err.Error())
	assert.NoDirExists(t, e.dir("projected", "kube-api-access"), "nothing is projected while a source fails")

	e.sources.Add(&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart"}})
	gid := int64(os.Getgid()) // a group the test may give away
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{FSGroup: &gid}
	require.NoError(t, e.m.Setup(ctx, pod))
	dir := e.dir("projected", "kube-api-access")
	assert.Equal(t, os.FileMode(0o640), mode(t, filepath.Join(dir, "token")).Perm(), "0600 widened to 0640 by the fsGroup")
	assert.Equal(t, os.FileMode(0o644), mode(t, filepath.Join(dir, "ca.crt")).Perm())
	st, err := os.Stat(filepath.Join(dir, dataDir(t, dir)))
	require.NoError(t, err)
	assert.NotZero(t, st.Mode()&os.ModeSetgid, "folders get setgid")
}

func dataDir(t *testing.T, dir string) string {
	ts, err := os.Readlink(filepath.Join(dir, "..data"))
	require.NoError(t, err)
	return ts
}

func TestUnsupportedVolume(t *testing.T) {
	e := newEnv(t)
	pod := newPod(
		corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "nfs", Path: "/x"}}},
		corev1.Volume{Name: "claim", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "c"}}},
		corev1.Volume{Name: "empty"},
		corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	)
	err := e.m.Setup(context.Background(), pod)
	require.Error(t, err)
	assert.ErrorIs(t, err, volume.ErrUnsupportedVolume)
	assert.Equal(t, `volume "data" has unsupported type "nfs"`+"\n"+
		`volume "claim" has unsupported type "persistentVolumeClaim"`+"\n"+
		`volume "empty" has unsupported type "none"`, err.Error())
	var ue *volume.UnsupportedError
	require.ErrorAs(t, err, &ue)
	assert.Equal(t, volume.UnsupportedError{Volume: "data", Type: "nfs"}, *ue)
	assert.DirExists(t, e.dir("empty-dir", "scratch"), "the supported volume is still set up")

	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "data", MountPath: "/data"}}
	_, err = e.m.Mounts(pod, &pod.Spec.Containers[0])
	assert.ErrorIs(t, err, volume.ErrUnsupportedVolume)
}

func TestBadPods(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	assert.ErrorIs(t, e.m.Setup(ctx, nil), volume.ErrInvalidPod)
	for _, bad := range []string{"", "..", "a/b"} {
		p := newPod()
		p.UID = "x"
		p.UID = typesUID(bad)
		assert.ErrorIs(t, e.m.Setup(ctx, p), volume.ErrInvalidPod, "uid %q", bad)
		assert.ErrorIs(t, e.m.Teardown(ctx, typesUID(bad)), volume.ErrInvalidPod)
	}
	p := newPod(
		corev1.Volume{Name: "../x", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		corev1.Volume{Name: "twice", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		corev1.Volume{Name: "twice", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	)
	err := e.m.Setup(ctx, p)
	assert.ErrorIs(t, err, volume.ErrInvalidPod)
	assert.Contains(t, err.Error(), `volume "twice" is declared twice`)
	_, err = os.Stat(filepath.Join(e.root, "pods", "x"))
	assert.True(t, os.IsNotExist(err), "nothing escaped the pods folder")

	_, err = volume.New(volume.Config{RootDir: "relative"})
	assert.ErrorIs(t, err, volume.ErrInvalidConfig)
	noSrc, err := volume.New(volume.Config{RootDir: t.TempDir(), Mounter: volume.NoMount{}})
	require.NoError(t, err)
	none, err := noSrc.PodsOnDisk()
	assert.NoError(t, err)
	assert.Empty(t, none)
	err = noSrc.Setup(ctx, newPod(cmVol("c", "x")))
	assert.ErrorIs(t, err, volume.ErrInvalidConfig)
}

func TestTeardown(t *testing.T) {
	e := newEnv(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "creds"}, Data: map[string][]byte{"k": []byte("v")}})
	ctx := context.Background()
	pod := newPod(
		corev1.Volume{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "creds"}}},
		corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
	)
	require.NoError(t, e.m.Setup(ctx, pod))

	e.mounter.UnmountErr = errors.New("device busy")
	err := e.m.Teardown(ctx, uid)
	require.Error(t, err)
	assert.ErrorContains(t, err, "device busy")
	assert.FileExists(t, filepath.Join(e.dir("secret", "creds"), "k"), "nothing removed while a mount remains")

	e.mounter.UnmountErr = nil
	require.NoError(t, e.m.Teardown(ctx, uid))
	assert.Contains(t, e.mounter.Calls(), "umount "+e.dir("secret", "creds"))
	assert.NoDirExists(t, filepath.Join(e.root, "pods", uid, "volumes"))
	require.NoError(t, e.m.Teardown(ctx, uid), "Teardown again is fine")
	uids, err := e.m.PodsOnDisk()
	require.NoError(t, err)
	assert.Equal(t, []typesUIDAlias{uid}, uids, "the pod folder itself stays for the agent's own files")
	require.NoError(t, e.m.Teardown(ctx, "never-seen"))
	assert.Zero(t, e.m.PodLocks(), "no per-pod state is left behind")
}

func TestMounts(t *testing.T) {
	e := newEnv(t, configMap("settings", map[string]string{"level": "debug"}))
	ctx := context.Background()
	host := t.TempDir()
	pod := newPod(
		cmVol("cfg", "settings"),
		corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: host}}},
	)
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{
		{Name: "cfg", MountPath: "/etc/app"},
		{Name: "scratch", MountPath: "/tmp/work", MountPropagation: ptr.To(corev1.MountPropagationHostToContainer)},
		{Name: "host", MountPath: "/host", ReadOnly: true, MountPropagation: ptr.To(corev1.MountPropagationBidirectional)},
		{Name: "scratch", MountPath: "relative/path"},
	}
	require.NoError(t, e.m.Setup(ctx, pod))
	m, err := volume.New(volume.Config{RootDir: e.root, Sources: e.sources, Mounter: volume.NoMount{}})
	require.NoError(t, err)
	got, err := m.Mounts(pod, &pod.Spec.Containers[0])
	require.NoError(t, err)
	assert.Equal(t, []*runtimeapi.Mount{
		{ContainerPath: "/etc/app", HostPath: e.dir("configmap", "cfg"), Readonly: true, SelinuxRelabel: true},
		{ContainerPath: "/tmp/work", HostPath: e.dir("empty-dir", "scratch"), SelinuxRelabel: true, Propagation: runtimeapi.MountPropagation_PROPAGATION_HOST_TO_CONTAINER},
		{ContainerPath: "/host", HostPath: host, Readonly: true, Propagation: runtimeapi.MountPropagation_PROPAGATION_BIDIRECTIONAL},
		{ContainerPath: "/relative/path", HostPath: e.dir("empty-dir", "scratch"), SelinuxRelabel: true},
	}, got)

	for _, tc := range []struct {
		vm  corev1.VolumeMount
		err string
		is  error
	}{
		{corev1.VolumeMount{Name: "ghost", MountPath: "/x"}, `cannot find volume "ghost" to mount into container "app"`, volume.ErrInvalidPod},
		{corev1.VolumeMount{Name: "scratch", MountPath: "/x", MountPropagation: ptr.To(corev1.MountPropagationMode("Sideways"))}, `invalid MountPropagation mode: "Sideways"`, volume.ErrInvalidPod},
		{corev1.VolumeMount{Name: "scratch", MountPath: "/x", RecursiveReadOnly: ptr.To(corev1.RecursiveReadOnlyEnabled)}, `failed to resolve recursive read-only mode: volume "scratch" requires recursiveReadOnly to be "Disabled" if readOnly is false`, volume.ErrInvalidPod},
		{corev1.VolumeMount{Name: "scratch", MountPath: "/x", ReadOnly: true, RecursiveReadOnly: ptr.To(corev1.RecursiveReadOnlyEnabled)}, `failed to resolve recursive read-only mode: volume "scratch" requires recursiveReadOnly to be "Enabled", but it is not supported by the runtime`, volume.ErrInvalidPod},
	} {
		c := corev1.Container{Name: "app", VolumeMounts: []corev1.VolumeMount{tc.vm}}
		_, err := m.Mounts(pod, &c)
		require.Error(t, err, tc.err)
		assert.Equal(t, tc.err, err.Error())
		assert.ErrorIs(t, err, tc.is)
	}

	p, err := m.VolumePath(pod, "scratch")
	require.NoError(t, err)
	assert.Equal(t, e.dir("empty-dir", "scratch"), p)
	p, err = m.VolumePath(pod, "host")
	require.NoError(t, err)
	assert.Equal(t, host, p)
	_, err = m.VolumePath(pod, "ghost")
	assert.ErrorIs(t, err, volume.ErrInvalidPod)

	notYet := newPod(cmVol("later", "settings"))
	notYet.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "later", MountPath: "/later"}}
	_, err = m.Mounts(notYet, &notYet.Spec.Containers[0])
	assert.ErrorIs(t, err, volume.ErrNotSetUp)
	_, err = m.VolumePath(notYet, "later")
	assert.ErrorIs(t, err, volume.ErrNotSetUp)
}

func TestMountsSubPath(t *testing.T) {
	e := newEnv(t, configMap("settings", map[string]string{"level": "debug"}))
	ctx := context.Background()
	outside := t.TempDir()
	pod := newPod(cmVol("cfg", "settings"), corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	require.NoError(t, e.m.Setup(ctx, pod))
	scratch := e.dir("empty-dir", "scratch")
	require.NoError(t, os.Symlink(outside, filepath.Join(scratch, "evil-abs")))
	require.NoError(t, os.Symlink("../../../../..", filepath.Join(scratch, "evil-rel")))
	require.NoError(t, os.Mkdir(filepath.Join(scratch, "real"), 0o755))
	require.NoError(t, os.Symlink("real", filepath.Join(scratch, "inside")))
	m, err := volume.New(volume.Config{RootDir: e.root, Sources: e.sources, Mounter: volume.NoMount{}})
	require.NoError(t, err)

	mount := func(vm corev1.VolumeMount, env ...*runtimeapi.KeyValue) (*runtimeapi.Mount, error) {
		c := corev1.Container{Name: "app", VolumeMounts: []corev1.VolumeMount{vm}}
		got, err := m.Mounts(pod, &c, env...)
		if err != nil {
			return nil, err
		}
		return got[0], nil
	}

	got, err := mount(corev1.VolumeMount{Name: "scratch", MountPath: "/w", SubPath: "new/deep"})
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(scratch, "new/deep"), got.HostPath)
	assert.DirExists(t, filepath.Join(scratch, "new/deep"), "a missing subPath is created")

	got, err = mount(corev1.VolumeMount{Name: "scratch", MountPath: "/w", SubPath: "inside"})
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(scratch, "real"), got.HostPath, "a symlink that stays inside resolves")

	got, err = mount(corev1.VolumeMount{Name: "cfg", MountPath: "/etc/level", SubPath: "level"})
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(e.dir("configmap", "cfg"), dataDir(t, e.dir("configmap", "cfg")), "level"), got.HostPath, "a configMap key through ..data")
	assert.True(t, got.Readonly)

	got, err = mount(corev1.VolumeMount{Name: "scratch", MountPath: "/w", SubPathExpr: "$(POD)/logs"}, &runtimeapi.KeyValue{Key: "POD", Value: []byte("cart-0")})
	require.NoError(t, err)
	assert.Equal(t, filepath.Join(scratch, "cart-0/logs"), got.HostPath)

	for _, tc := range []struct {
		vm  corev1.VolumeMount
		env []*runtimeapi.KeyValue
		err string
	}{
		{vm: corev1.VolumeMount{Name: "scratch", MountPath: "/w", SubPath: "evil-abs"}, err: `failed to prepare subPath for volumeMount "scratch" of container "app"`},
		{vm: corev1.VolumeMount{Name: "scratch", MountPath: "/w", SubPath: "evil-abs/x"}, err: `failed to prepare subPath for volumeMount "scratch" of container "app"`},
		{vm: corev1.VolumeMount{Name: "scratch", MountPath: "/w", SubPath: "evil-rel"}, err: `failed to prepare subPath for volumeMount "scratch" of container "app"`},
		{vm: corev1.VolumeMount{Name: "scratch", MountPath: "/w", SubPath: "a/../../x"}, err: "unable to provision SubPath `a/../../x`: must not contain '..'"},
		{vm: corev1.VolumeMount{Name: "scratch", MountPath: "/w", SubPath: "/etc"}, err: "error SubPath `/etc` must not be an absolute path"},
		{vm: corev1.VolumeMount{Name: "scratch", MountPath: "/w", SubPathExpr: "$(A)/$(B)/$(C)"}, env: []*runtimeapi.KeyValue{{Key: "B", Value: []byte("b")}, {Key: "C"}}, err: "missing value for A, C"},
		{vm: corev1.VolumeMount{Name: "scratch", MountPath: "/w", SubPathExpr: "$(UP)"}, env: []*runtimeapi.KeyValue{{Key: "UP", Value: []byte("..")}}, err: "unable to provision SubPath `..`: must not contain '..'"},
	} {
		_, err := mount(tc.vm, tc.env...)
		require.Error(t, err, tc.vm.SubPath+tc.vm.SubPathExpr)
		assert.Equal(t, tc.err, err.Error())
		assert.ErrorIs(t, err, volume.ErrInvalidSubPath)
	}
	entries, _ := os.ReadDir(outside)
	assert.Empty(t, entries, "nothing was created outside the volume")
}

func TestMountsSubPathBindMount(t *testing.T) {
	requireRoot(t)
	root := t.TempDir()
	m, err := volume.New(volume.Config{RootDir: root})
	require.NoError(t, err)
	ctx := context.Background()
	pod := newPod(corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "scratch", MountPath: "/w", SubPath: "data"}}
	t.Cleanup(func() { _ = m.Teardown(ctx, uid) })
	require.NoError(t, m.Setup(ctx, pod))
	scratch := filepath.Join(root, "pods", uid, "volumes", "kubernetes.io~empty-dir", "scratch")
	got, err := m.Mounts(pod, &pod.Spec.Containers[0])
	require.NoError(t, err)
	target := filepath.Join(root, "pods", uid, "volume-subpaths", "scratch", "app", "0")
	assert.Equal(t, target, got[0].HostPath)
	assert.Equal(t, 1, countMounts(t, target))
	require.NoError(t, os.WriteFile(filepath.Join(scratch, "data", "f"), []byte("via volume"), 0o644))
	assert.Equal(t, "via volume", read(t, filepath.Join(target, "f")), "the bind shows the subPath")

	// The container swaps the folder for a symlink out of the volume: the pinned
	// mount still shows the folder it was checked against.
	outside := t.TempDir()
	require.NoError(t, os.Rename(filepath.Join(scratch, "data"), filepath.Join(scratch, "moved")))
	require.NoError(t, os.Symlink(outside, filepath.Join(scratch, "data")))
	assert.Equal(t, "via volume", read(t, filepath.Join(target, "f")))

	// Mounts again (a container restart) re-pins instead of stacking, and refuses
	// the symlink now in place.
	_, err = m.Mounts(pod, &pod.Spec.Containers[0])
	assert.ErrorIs(t, err, volume.ErrInvalidSubPath)
	assert.LessOrEqual(t, countMounts(t, target), 1)

	require.NoError(t, m.Teardown(ctx, uid))
	assert.Equal(t, 0, countMounts(t, filepath.Join(root, "pods", uid)))
	assert.DirExists(t, outside, "teardown did not follow the symlink")
}

// TestMountsSubPathConfigMapKey pins one configMap key with a real bind mount.
// As under a kubelet, the pinned file does not follow later updates (subPath
// mounts of configMaps are known not to), while the volume itself does.
func TestMountsSubPathConfigMapKey(t *testing.T) {
	requireRoot(t)
	root := t.TempDir()
	sources := volumetest.New(nil, configMap("settings", map[string]string{"level": "debug"}))
	m, err := volume.New(volume.Config{RootDir: root, Sources: sources})
	require.NoError(t, err)
	ctx := context.Background()
	pod := newPod(cmVol("cfg", "settings"))
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "cfg", MountPath: "/etc/level", SubPath: "level"}}
	t.Cleanup(func() { _ = m.Teardown(ctx, uid) })
	require.NoError(t, m.Setup(ctx, pod))
	got, err := m.Mounts(pod, &pod.Spec.Containers[0])
	require.NoError(t, err)
	target := filepath.Join(root, "pods", uid, "volume-subpaths", "cfg", "app", "0")
	require.Equal(t, target, got[0].HostPath)
	assert.True(t, got[0].Readonly)
	assert.Equal(t, "debug", read(t, target))

	sources.Add(configMap("settings", map[string]string{"level": "info"}))
	require.NoError(t, m.Setup(ctx, pod))
	cfgDir := filepath.Join(root, "pods", uid, "volumes", "kubernetes.io~configmap", "cfg")
	assert.Equal(t, "info", read(t, filepath.Join(cfgDir, "level")), "the volume follows the update")
	assert.Equal(t, "debug", read(t, target), "the pinned subPath keeps the file it was given")

	require.NoError(t, m.Teardown(ctx, uid))
	assert.Equal(t, 0, countMounts(t, filepath.Join(root, "pods", uid)))
}

type metricsRecorder struct{ ops []string }

func (r *metricsRecorder) VolumeOperation(plugin, op string, d time.Duration, err error) {
	status := "success"
	if err != nil {
		status = "fail-unknown"
	}
	r.ops = append(r.ops, plugin+" "+op+" "+status)
}

func TestMetrics(t *testing.T) {
	e := newEnv(t, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "creds"}, Data: map[string][]byte{"k": []byte("v")}})
	rec := &metricsRecorder{}
	m, err := volume.New(volume.Config{RootDir: e.root, Sources: e.sources, Mounter: e.mounter, Metrics: rec})
	require.NoError(t, err)
	ctx := context.Background()
	pod := newPod(
		corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		corev1.Volume{Name: "creds", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "creds"}}},
		cmVol("cfg", "absent"),
		corev1.Volume{Name: "data", VolumeSource: corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{}}},
	)
	require.Error(t, m.Setup(ctx, pod))
	require.NoError(t, m.Teardown(ctx, uid))
	assert.Equal(t, []string{
		"kubernetes.io/empty-dir volume_mount success",
		"kubernetes.io/secret volume_mount success",
		"kubernetes.io/configmap volume_mount fail-unknown",
		"kubernetes.io/secret volume_unmount success",
	}, rec.ops)
}

func TestConcurrentCallsForOnePod(t *testing.T) {
	e := newEnv(t, configMap("settings", map[string]string{"level": "debug"}))
	ctx := context.Background()
	pod := newPod(cmVol("cfg", "settings"), corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "cfg", MountPath: "/etc/app"}}
	require.NoError(t, e.m.Setup(ctx, pod))
	done := make(chan error, 40)
	for i := 0; i < 20; i++ {
		go func(i int) {
			e.sources.Add(configMap("settings", map[string]string{"level": strings.Repeat("x", i)}))
			done <- e.m.Setup(ctx, pod)
		}(i)
		go func() {
			_, err := e.m.Mounts(pod, &pod.Spec.Containers[0])
			done <- err
		}()
	}
	for i := 0; i < 40; i++ {
		assert.NoError(t, <-done)
	}
	assert.Zero(t, e.m.PodLocks())
	entries, err := os.ReadDir(e.dir("configmap", "cfg"))
	require.NoError(t, err)
	assert.Len(t, entries, 3, "one data folder, ..data and the key's link after concurrent refreshes")
}

func TestImageVolumeMounts(t *testing.T) {
	e := newEnv(t)
	rec := &metricsRecorder{}
	m, err := volume.New(volume.Config{RootDir: e.root, Sources: e.sources, Mounter: e.mounter, Metrics: rec})
	require.NoError(t, err)
	ctx := context.Background()
	pod := newPod(corev1.Volume{Name: "models", VolumeSource: corev1.VolumeSource{Image: &corev1.ImageVolumeSource{
		Reference: "registry.example/models:v1", PullPolicy: corev1.PullIfNotPresent}}})
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{
		{Name: "models", MountPath: "/models"},
		{Name: "models", MountPath: "/weights", SubPath: "data/weights", MountPropagation: ptr.To(corev1.MountPropagationHostToContainer)},
		{Name: "models", MountPath: "/by-env", SubPathExpr: "data/$(FLAVOUR)", ReadOnly: true, RecursiveReadOnly: ptr.To(corev1.RecursiveReadOnlyIfPossible)},
	}
	require.NoError(t, m.Setup(ctx, pod))
	assert.NoDirExists(t, e.dir("image", "models"), "an image volume has nothing on disk")
	assert.Equal(t, []string{"kubernetes.io/image volume_mount success"}, rec.ops)

	got, err := m.Mounts(pod, &pod.Spec.Containers[0], &runtimeapi.KeyValue{Key: "FLAVOUR", Value: []byte("small")})
	require.NoError(t, err)
	spec := &runtimeapi.ImageSpec{Image: "registry.example/models:v1", UserSpecifiedImage: "registry.example/models:v1"}
	assert.Equal(t, []*runtimeapi.Mount{
		{ContainerPath: "/models", Readonly: true, Image: spec},
		{ContainerPath: "/weights", Readonly: true, Image: spec, ImageSubPath: "data/weights", Propagation: runtimeapi.MountPropagation_PROPAGATION_HOST_TO_CONTAINER},
		{ContainerPath: "/by-env", Readonly: true, Image: spec, ImageSubPath: "data/small"},
	}, got)
	assert.NoDirExists(t, filepath.Join(e.root, "pods", string(uid), "volume-subpaths"), "the runtime resolves an image subPath, not the kubelet")

	for _, tc := range []struct {
		vm  corev1.VolumeMount
		err string
	}{
		{corev1.VolumeMount{Name: "models", MountPath: "/x", SubPath: "/etc"}, "error SubPath `/etc` must not be an absolute path"},
		{corev1.VolumeMount{Name: "models", MountPath: "/x", SubPath: "a/../../etc"}, "unable to provision SubPath `a/../../etc`: must not contain '..'"},
		{corev1.VolumeMount{Name: "models", MountPath: "/x", SubPathExpr: "$(MISSING)"}, "missing value for MISSING"},
	} {
		c := corev1.Container{Name: "app", VolumeMounts: []corev1.VolumeMount{tc.vm}}
		_, err := m.Mounts(pod, &c)
		require.Error(t, err, tc.err)
		assert.Equal(t, tc.err, err.Error())
		assert.ErrorIs(t, err, volume.ErrInvalidSubPath)
	}
	require.NoError(t, m.Teardown(ctx, uid))
}
