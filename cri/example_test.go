package cri_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/nodekit-dev/nodekit/cri"
	"github.com/nodekit-dev/nodekit/cri/fakeruntime"
)

// Example runs a pod the kubelet's way against the in-process fake runtime, then
// probes its container with ExecSync.
func Example() {
	dir, _ := os.MkdirTemp("", "cri-example")
	defer os.RemoveAll(dir)
	rt := fakeruntime.New()
	srv, err := rt.Serve(filepath.Join(dir, "cri.sock"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Stop()

	ctx := context.Background()
	client, err := cri.New(ctx, cri.Config{Endpoint: srv.Endpoint()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "1234"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox:1.36"}}},
	}
	sandboxCfg, _ := cri.PodSandboxConfig(pod, cri.PodOptions{})
	sandboxID, _ := client.RunPodSandbox(ctx, sandboxCfg, "")
	imageRef, _, _ := client.EnsureImage(ctx, "busybox:1.36", nil, sandboxCfg)
	containerCfg, _ := cri.ContainerConfig(pod, "app", 0, imageRef)
	containerID, _ := client.CreateContainer(ctx, sandboxID, containerCfg, sandboxCfg)
	_ = client.StartContainer(ctx, containerID)

	stdout, _, code, err := client.ExecSync(ctx, containerID, []string{"echo", "alive"}, 0)
	fmt.Printf("exec: %q exit=%d err=%v\n", stdout, code, err)

	containers, _ := client.ListContainers(ctx, nil)
	for _, c := range containers {
		fmt.Println(c.Labels[cri.LabelPodNamespace]+"/"+c.Labels[cri.LabelPodName], c.Labels[cri.LabelContainerName], c.State)
	}
	fmt.Println(rt.CallNames())
	// Output:
	// exec: "alive\n" exit=0 err=<nil>
	// default/web app CONTAINER_RUNNING
	// [Version RunPodSandbox ImageStatus PullImage CreateContainer StartContainer ExecSync ListContainers]
}

// ExampleClient_Readiness shows the node verdict of a runtime without a CNI config.
func ExampleClient_Readiness() {
	dir, _ := os.MkdirTemp("", "cri-example")
	defer os.RemoveAll(dir)
	rt := fakeruntime.New()
	rt.NetworkNotReady()
	srv, _ := rt.Serve(filepath.Join(dir, "cri.sock"))
	defer srv.Stop()

	client, err := cri.New(context.Background(), cri.Config{Endpoint: srv.Endpoint()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	r, _ := client.Readiness(context.Background())
	fmt.Println(r.Ready, r.Reason)
	fmt.Println(r.Message)
	// Output:
	// false KubeletNotReady
	// container runtime network not ready: NetworkReady=false reason:NetworkPluginNotReady message:Network plugin returns error: cni plugin not initialized
}

// ExampleError shows how a failed call reads and how to test it.
func ExampleError() {
	dir, _ := os.MkdirTemp("", "cri-example")
	defer os.RemoveAll(dir)
	srv, _ := fakeruntime.New().Serve(filepath.Join(dir, "cri.sock"))
	defer srv.Stop()
	client, _ := cri.New(context.Background(), cri.Config{Endpoint: srv.Endpoint()})
	defer client.Close()

	_, err := client.ContainerStatus(context.Background(), "3f2a")
	fmt.Println(errors.Is(err, cri.ErrNotFound))
	fmt.Println(err)
	// Output:
	// true
	// cri ContainerStatus container "3f2a": an error occurred when try to find container "3f2a": not found (NotFound)
}
