package volume_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodekit-dev/nodekit/volume"
	"github.com/nodekit-dev/nodekit/volume/volumetest"
)

// timestamp matches the atomic writer's data folder, ..2026_12_03_05_30_00.<random>.
var timestamp = regexp.MustCompile(`\.\.\d{4}(_\d\d){5}\.\d+`)

func ExampleManager() {
	root, err := os.MkdirTemp("", "kubelet-root")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(root)

	sources := volumetest.New(nil, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "settings"},
		Data:       map[string]string{"level": "debug"},
	})
	m, err := volume.New(volume.Config{RootDir: root, Sources: sources, Mounter: volume.NoMount{}})
	if err != nil {
		panic(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart-0", UID: "1234"},
		Spec: corev1.PodSpec{
			Volumes: []corev1.Volume{
				{Name: "cfg", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}},
				{Name: "cache", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
				{Name: "data", VolumeSource: corev1.VolumeSource{NFS: &corev1.NFSVolumeSource{Server: "nas", Path: "/data"}}},
			},
			Containers: []corev1.Container{{Name: "app", VolumeMounts: []corev1.VolumeMount{
				{Name: "cfg", MountPath: "/etc/cart"},
				{Name: "cache", MountPath: "/var/cache/cart", SubPath: "v1"},
			}}},
		},
	}
	ctx := context.Background()
	// The nfs volume fails; the others are set up all the same.
	fmt.Println(m.Setup(ctx, pod))

	mounts, err := m.Mounts(pod, &pod.Spec.Containers[0])
	if err != nil {
		panic(err)
	}
	for _, mt := range mounts {
		fmt.Printf("%s <- %s readonly=%v\n", mt.ContainerPath, strings.TrimPrefix(mt.HostPath, root), mt.Readonly)
	}

	var names []string
	_ = filepath.Walk(filepath.Join(m.PodVolumesDir("1234"), "kubernetes.io~configmap", "cfg"), func(p string, info os.FileInfo, err error) error {
		rel, _ := filepath.Rel(m.PodVolumesDir("1234"), p)
		names = append(names, timestamp.ReplaceAllString(rel, "..<timestamp>"))
		return nil
	})
	sort.Strings(names)
	fmt.Println(strings.Join(names, "\n"))

	if err := m.Teardown(ctx, "1234"); err != nil {
		panic(err)
	}
	// Output:
	// volume "data" has unsupported type "nfs"
	// /etc/cart <- /pods/1234/volumes/kubernetes.io~configmap/cfg readonly=true
	// /var/cache/cart <- /pods/1234/volumes/kubernetes.io~empty-dir/cache/v1 readonly=false
	// kubernetes.io~configmap/cfg
	// kubernetes.io~configmap/cfg/..<timestamp>
	// kubernetes.io~configmap/cfg/..<timestamp>/level
	// kubernetes.io~configmap/cfg/..data
	// kubernetes.io~configmap/cfg/level
}
