// Package podfiles_test runs nodekit's podenv and volume next to the kubelet's
// own code (k8s.io/kubernetes v1.37.2) on the same inputs: $(VAR) expansion,
// service link variables, downward API field paths and resource values, and the
// atomic writer's on-disk result.
package podfiles_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	resourcehelper "k8s.io/kubernetes/pkg/api/v1/resource"
	podshelper "k8s.io/kubernetes/pkg/apis/core/pods"
	"k8s.io/kubernetes/pkg/fieldpath"
	"k8s.io/kubernetes/pkg/kubelet/envvars"
	envutil "k8s.io/kubernetes/pkg/kubelet/util/env"
	volumeutil "k8s.io/kubernetes/pkg/volume/util"
	"k8s.io/kubernetes/third_party/forked/golang/expansion"

	"github.com/nodekit-dev/nodekit/internal/downward"
	"github.com/nodekit-dev/nodekit/podenv"
	"github.com/nodekit-dev/nodekit/volume"
	"github.com/nodekit-dev/nodekit/volume/volumetest"
)

// TestExpandMatchesKubelet feeds both expanders 200k random strings over an
// alphabet dense in $, ( and ), with multi-byte characters among them.
func TestExpandMatchesKubelet(t *testing.T) {
	vars := map[string]string{"A": "alpha", "B": "", "A_B": "ab", "$": "dollar", "(": "paren", "": "empty"}
	svc := map[string]string{"A": "shadowed", "S": "svc"}
	upstream := expansion.MappingFuncFor(vars, svc)
	ours := downward.Lookup(vars, svc)
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"$", "$", "$", "(", "(", ")", "A", "B", "_", "S", " ", "x", "é", "世"}
	for i := 0; i < 200000; i++ {
		var b strings.Builder
		for j := rng.IntN(14); j > 0; j-- {
			b.WriteString(alphabet[rng.IntN(len(alphabet))])
		}
		in := b.String()
		if want, got := expansion.Expand(in, upstream), downward.Expand(in, ours); want != got {
			t.Fatalf("Expand(%q): kubelet %q, nodekit %q", in, want, got)
		}
	}
}

// TestServiceVarsMatchKubelet compares podenv.ServiceVars with envvars.FromServices
// on random services: names with dashes, 1-4 ports, named and unnamed, every
// protocol, IPv4 and IPv6, headless and unallocated.
func TestServiceVarsMatchKubelet(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	names := []string{"foo", "foo-bar", "a-b-c", "kubernetes", "x1"}
	ips := []string{"10.0.0.11", "fd00::1", "None", ""}
	protos := []v1.Protocol{"", v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP}
	portNames := []string{"", "http", "metrics-port", "dns"}
	for i := 0; i < 5000; i++ {
		s := &v1.Service{ObjectMeta: metav1.ObjectMeta{Name: names[rng.IntN(len(names))]},
			Spec: v1.ServiceSpec{ClusterIP: ips[rng.IntN(len(ips))]}}
		for p := 0; p < 1+rng.IntN(4); p++ {
			s.Spec.Ports = append(s.Spec.Ports, v1.ServicePort{
				Name: portNames[rng.IntN(len(portNames))], Port: int32(1 + rng.IntN(65535)), Protocol: protos[rng.IntN(len(protos))]})
		}
		var want []string
		for _, e := range envvars.FromServices([]*v1.Service{s}) {
			want = append(want, e.Name+"="+e.Value)
		}
		var got []string
		for _, kv := range podenv.ServiceVars(s) {
			got = append(got, kv[0]+"="+kv[1])
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("service %+v: kubelet -, nodekit +:\n%s", s.Spec, diff)
		}
	}
}

// TestFieldPathsMatchKubelet compares the field label check and the metadata
// extraction, results and error texts, on the paths the API accepts and on bad ones.
func TestFieldPathsMatchKubelet(t *testing.T) {
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: "web-0", Namespace: "prod", UID: "uid-1",
		Labels:      map[string]string{"app": "web", "b": "x\"y", "example.com/tier": "front"},
		Annotations: map[string]string{"note": "line1\nline2", "a": ""},
	}}
	paths := []string{
		"metadata.name", "metadata.namespace", "metadata.uid", "metadata.labels", "metadata.annotations",
		"metadata.labels['app']", "metadata.labels['example.com/tier']", "metadata.labels['missing']",
		"metadata.annotations['note']", "metadata.annotations['NOTE']", "metadata.labels['Bad Key']",
		"metadata.labels['']", "metadata.name['x']", "spec.nodeName", "spec.host", "spec.restartPolicy",
		"spec.serviceAccountName", "spec.schedulerName", "status.phase", "status.hostIP", "status.hostIPs",
		"status.podIP", "status.podIPs", "spec.containers", "", "metadata.labels[app]", "['x']",
	}
	for _, version := range []string{"v1", "v2", ""} {
		for _, p := range paths {
			wantPath, _, wantErr := podshelper.ConvertDownwardAPIFieldLabel(version, p, "")
			gotPath, gotErr := downward.CheckFieldLabel(version, p)
			if errText(wantErr) != errText(gotErr) || (wantErr == nil && wantPath != gotPath) {
				t.Errorf("CheckFieldLabel(%q, %q): kubelet (%q, %v), nodekit (%q, %v)", version, p, wantPath, wantErr, gotPath, gotErr)
			}
		}
	}
	for _, p := range paths {
		want, wantErr := fieldpath.ExtractFieldPathAsString(pod, p)
		got, gotErr := downward.Metadata(pod, p)
		if want != got || errText(wantErr) != errText(gotErr) {
			t.Errorf("Metadata(%q): kubelet (%q, %v), nodekit (%q, %v)", p, want, wantErr, got, gotErr)
		}
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestResourceValuesMatchKubelet compares resourceFieldRef values with node
// allocatable defaulting on random requests, limits and divisors, including
// zero, tiny and huge ones.
func TestResourceValuesMatchKubelet(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	qs := []string{"0", "1", "250m", "1m", "3", "1.5", "100Mi", "1Gi", "1G", "123456789", "1e30", "1n", "999999999999999999", "2Ki", "1.1"}
	divisors := []string{"", "1", "1m", "1Mi", "1Gi", "1k", "3", "1n", "1e20", "7"}
	resources := []string{"limits.cpu", "limits.memory", "limits.ephemeral-storage", "requests.cpu", "requests.memory",
		"requests.ephemeral-storage", "requests.hugepages-2Mi", "limits.hugepages-1Gi", "limits.nvidia.com/gpu", "requests"}
	pick := func(list []string) string { return list[rng.IntN(len(list))] }
	list := func() v1.ResourceList {
		l := v1.ResourceList{}
		for _, r := range []v1.ResourceName{"cpu", "memory", "ephemeral-storage", "hugepages-2Mi", "hugepages-1Gi"} {
			if rng.IntN(2) == 0 {
				l[r] = resource.MustParse(pick(qs))
			}
		}
		return l
	}
	for i := 0; i < 20000; i++ {
		c := v1.Container{Name: "app", Resources: v1.ResourceRequirements{Requests: list(), Limits: list()}}
		pod := &v1.Pod{Spec: v1.PodSpec{Containers: []v1.Container{c}}}
		alloc := list()
		fs := &v1.ResourceFieldSelector{ContainerName: "app", Resource: pick(resources)}
		if d := pick(divisors); d != "" {
			fs.Divisor = resource.MustParse(d)
		}
		want, wantErr := resourcehelper.ExtractResourceValueByContainerNameAndNodeAllocatable(fs, pod, "app", alloc)
		target, _, err := downward.FindContainer(pod, "app")
		if err != nil {
			t.Fatal(err)
		}
		got, gotErr := downward.ResourceValue(fs, downward.DefaultLimits(nil, target, alloc))
		if want != got || errText(wantErr) != errText(gotErr) {
			t.Fatalf("%s / %v with requests %v limits %v allocatable %v: kubelet (%q, %v), nodekit (%q, %v)",
				fs.Resource, fs.Divisor.String(), c.Resources.Requests, c.Resources.Limits, alloc, want, wantErr, got, gotErr)
		}
	}
}

var tsName = regexp.MustCompile(`\.\.\d{4}(_\d\d){5}\.\d+`)

// tree lists dir with the timestamped folder's name replaced, so two writers'
// results compare: links with targets, folders and files with modes and data.
func tree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		rel = tsName.ReplaceAllString(rel, "..TS")
		switch {
		case rel == ".":
		case info.Mode()&os.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			out = append(out, rel+" -> "+tsName.ReplaceAllString(target, "..TS"))
		case info.IsDir():
			out = append(out, rel+"/ "+info.Mode().Perm().String())
		default:
			data, _ := os.ReadFile(p)
			out = append(out, fmt.Sprintf("%s %s %q", rel, info.Mode().Perm(), data))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(out)
	return out
}

// TestAtomicWriterMatchesKubelet projects a sequence of configMap versions (keys
// added, removed, moved into folders, a key turned into a folder) with the
// kubelet's AtomicWriter and with volume.Manager, and compares the folders after
// every step.
func TestAtomicWriterMatchesKubelet(t *testing.T) {
	versions := []struct {
		data  map[string]string
		items []v1.KeyToPath
	}{
		{data: map[string]string{"a": "1", "b": "2"}},
		{data: map[string]string{"a": "1", "b": "2"}}, // unchanged
		{data: map[string]string{"a": "10", "c": "3"}},
		{data: map[string]string{"a": "10", "c": "3", "d": "4"}, items: []v1.KeyToPath{{Key: "a", Path: "conf/a"}, {Key: "c", Path: "conf/deep/c", Mode: ptr(0o600)}, {Key: "d", Path: "d"}}},
		{data: map[string]string{"a": "10", "d": "4"}, items: []v1.KeyToPath{{Key: "d", Path: "conf/d"}, {Key: "a", Path: "a"}}},
		{data: map[string]string{}},
		{data: map[string]string{"z": "26"}},
	}
	kubeletDir := t.TempDir()
	w, err := volumeutil.NewAtomicWriter(kubeletDir, "compare")
	if err != nil {
		t.Fatal(err)
	}
	root := t.TempDir()
	src := volumetest.New(nil)
	m, err := volume.New(volume.Config{RootDir: root, Sources: src, Mounter: volume.NoMount{}})
	if err != nil {
		t.Fatal(err)
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid"}}
	ourDir := filepath.Join(root, "pods", "uid", "volumes", "kubernetes.io~configmap", "cfg")
	for i, v := range versions {
		payload := map[string]volumeutil.FileProjection{}
		if len(v.items) == 0 {
			for k, d := range v.data {
				payload[k] = volumeutil.FileProjection{Data: []byte(d), Mode: 0o644}
			}
		} else {
			for _, it := range v.items {
				mode := int32(0o644)
				if it.Mode != nil {
					mode = *it.Mode
				}
				payload[it.Path] = volumeutil.FileProjection{Data: []byte(v.data[it.Key]), Mode: mode}
			}
		}
		if err := w.Write(payload, nil); err != nil {
			t.Fatalf("step %d: kubelet writer: %v", i, err)
		}
		src.Add(&v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cm"}, Data: v.data})
		pod.Spec.Volumes = []v1.Volume{{Name: "cfg", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
			LocalObjectReference: v1.LocalObjectReference{Name: "cm"}, Items: v.items}}}}
		if err := m.Setup(context.Background(), pod); err != nil {
			t.Fatalf("step %d: nodekit: %v", i, err)
		}
		if diff := cmp.Diff(tree(t, kubeletDir), tree(t, ourDir)); diff != "" {
			t.Errorf("step %d: kubelet -, nodekit +:\n%s", i, diff)
		}
	}
}

func ptr(v int32) *int32 { return &v }

// TestFolderBecomesFile is the one documented difference of the atomic writer:
// when a path that was a folder becomes a file, the kubelet's writer fails on
// every later Write ("read .../conf: is a directory") and the volume keeps its
// old contents; nodekit writes the new version.
func TestFolderBecomesFile(t *testing.T) {
	kubeletDir := t.TempDir()
	w, err := volumeutil.NewAtomicWriter(kubeletDir, "compare")
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(map[string]volumeutil.FileProjection{"conf/a": {Data: []byte("1"), Mode: 0o644}}, nil); err != nil {
		t.Fatal(err)
	}
	err = w.Write(map[string]volumeutil.FileProjection{"conf": {Data: []byte("2"), Mode: 0o644}}, nil)
	if err == nil || !strings.Contains(err.Error(), "is a directory") {
		t.Fatalf("kubelet writer: want the 'is a directory' failure, got %v", err)
	}
	t.Logf("kubelet: %v", err)

	root := t.TempDir()
	src := volumetest.New(nil, &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cm"}, Data: map[string]string{"k": "1"}})
	m, err := volume.New(volume.Config{RootDir: root, Sources: src, Mounter: volume.NoMount{}})
	if err != nil {
		t.Fatal(err)
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid"}}
	setup := func(path string) error {
		pod.Spec.Volumes = []v1.Volume{{Name: "cfg", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{
			LocalObjectReference: v1.LocalObjectReference{Name: "cm"}, Items: []v1.KeyToPath{{Key: "k", Path: path}}}}}}
		return m.Setup(context.Background(), pod)
	}
	if err := setup("conf/a"); err != nil {
		t.Fatal(err)
	}
	if err := setup("conf"); err != nil {
		t.Fatalf("nodekit: %v", err)
	}
	data, err := os.ReadFile(filepath.Join(root, "pods", "uid", "volumes", "kubernetes.io~configmap", "cfg", "conf"))
	if err != nil || string(data) != "1" {
		t.Fatalf("nodekit: conf = %q, %v", data, err)
	}
}

// TestEnvFileMatchesKubelet compares fileKeyRef values with the kubelet's env
// file parser (pkg/kubelet/util/env.ParseEnv) on 20,000 random files, through
// podenv.Env: the kubelet's value, or its two failures (a parse error is
// "couldn't parse env file", an absent or empty key "not found").
func TestEnvFileMatchesKubelet(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	dir := t.TempDir()
	pieces := []string{"K", "A", "=", "'", "'", " ", "\t", "#", "\n", "\n", "v", "x y", "K='v'\n", "A='1'\n", "K= 'z'\n", "# c\n"}
	b, err := podenv.New(podenv.Config{Source: noSource{}, VolumePath: func(*v1.Pod, string) (string, error) { return dir, nil }})
	if err != nil {
		t.Fatal(err)
	}
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p"}, Spec: v1.PodSpec{EnableServiceLinks: new(bool)}}
	c := &v1.Container{Env: []v1.EnvVar{{Name: "OUT", ValueFrom: &v1.EnvVarSource{FileKeyRef: &v1.FileKeySelector{VolumeName: "v", Path: "f.env", Key: "K"}}}}}
	var parseErrs, absent, values int
	defer func() { t.Logf("kubelet outcomes: %d parse errors, %d absent, %d values", parseErrs, absent, values) }()
	for i := 0; i < 5000; i++ {
		var sb strings.Builder
		for j := rng.IntN(12); j > 0; j-- {
			sb.WriteString(pieces[rng.IntN(len(pieces))])
		}
		content := sb.String()
		path := filepath.Join(dir, "f.env")
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		want, wantErr := envutil.ParseEnv(path, "K")
		got, gotErr := b.Env(context.Background(), pod, c, nil, nil)
		switch {
		case wantErr != nil:
			parseErrs++
			if gotErr == nil || gotErr.Error() != "couldn't parse env file" {
				t.Fatalf("%q: kubelet fails (%v), nodekit (%v, %v)", content, wantErr, got, gotErr)
			}
		case want == "":
			absent++
			if gotErr == nil || !strings.Contains(gotErr.Error(), "not found in file") {
				t.Fatalf("%q: kubelet finds nothing, nodekit (%v, %v)", content, got, gotErr)
			}
		default:
			values++
			if gotErr != nil || len(got) != 1 || string(got[0].Value) != want {
				t.Fatalf("%q: kubelet %q, nodekit (%v, %v)", content, want, got, gotErr)
			}
		}
	}
}

type noSource struct{}

func (noSource) ConfigMap(context.Context, string, string) (*v1.ConfigMap, error) {
	return nil, fmt.Errorf("unused")
}
func (noSource) Secret(context.Context, string, string) (*v1.Secret, error) {
	return nil, fmt.Errorf("unused")
}
func (noSource) Services(context.Context, string) ([]*v1.Service, error) { return nil, nil }
