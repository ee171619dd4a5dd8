package staticpod_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nodekit-dev/nodekit/staticpod"
)

// Load reads a folder once, as the kubelet does on each rescan: the good manifest
// loads with the kubelet's defaults, the broken one is reported with file, line and
// field, and neither affects the other.
func ExampleLoad() {
	dir, _ := os.MkdirTemp("", "manifests")
	defer os.RemoveAll(dir)
	_ = os.WriteFile(filepath.Join(dir, "etcd.yaml"), []byte(`apiVersion: v1
kind: Pod
metadata:
  name: etcd
  namespace: kube-system
spec:
  hostNetwork: true
  containers:
  - name: etcd
    image: registry.k8s.io/etcd:3.6.4-0
`), 0o644)
	_ = os.WriteFile(filepath.Join(dir, "typo.yaml"), []byte(`apiVersion: v1
kind: Pod
metadata:
  name: typo
spec:
  containers:
  - name: typo
    imagee: busybox
`), 0o644)

	snap, err := staticpod.Load(context.Background(), staticpod.Config{Dir: dir, NodeName: "cp-1"})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, pod := range snap.Pods {
		fmt.Println(pod.Namespace+"/"+pod.Name, pod.Spec.NodeName, pod.Status.Phase,
			pod.Annotations[staticpod.AnnotationConfigSource], pod.Spec.Tolerations[0].Effect)
	}
	for _, e := range snap.Errors {
		fmt.Println(filepath.Base(e.Path), e.Line, e.Field, e.Detail)
	}
	// Output:
	// kube-system/etcd-cp-1 cp-1 Pending file NoExecute
	// typo.yaml 8 spec.containers[0].imagee unknown field "imagee" (did you mean "image"?)
}

// A Watcher reports the initial set, then every change; a broken edit keeps the
// last good pod running by default.
func ExampleWatcher() {
	dir, _ := os.MkdirTemp("", "manifests")
	defer os.RemoveAll(dir)
	write := func(image string) {
		tmp := filepath.Join(dir, ".web.yaml.tmp")
		_ = os.WriteFile(tmp, []byte("apiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: web\n    "+image+"\n"), 0o644)
		_ = os.Rename(tmp, filepath.Join(dir, "web.yaml"))
	}
	write("image: nginx:1")

	w, _ := staticpod.New(staticpod.Config{Dir: dir, NodeName: "node-a"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = w.Run(ctx); close(done) }()

	show := func(ev staticpod.Event) {
		fmt.Print(ev.Type, ":")
		for _, p := range ev.Pods {
			fmt.Print(" ", p.Name, "=", p.Spec.Containers[0].Image)
		}
		if ev.Err != nil {
			fmt.Print(" (kept last good: ", ev.KeptLastGood, ")")
		}
		fmt.Println()
	}
	show(<-w.Events())
	write("image: nginx:2")
	show(<-w.Events())
	write("image: [nginx:3")
	show(<-w.Events())
	cancel()
	<-done
	// Output:
	// Sync: web-node-a=nginx:1
	// Update: web-node-a=nginx:2
	// Error: web-node-a=nginx:2 (kept last good: true)
}
