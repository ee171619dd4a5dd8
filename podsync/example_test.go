package podsync_test

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/nodekit-dev/nodekit/podsync"
	"github.com/nodekit-dev/nodekit/podsync/podsynctest"
)

// Drive one pod through the kubelet's decisions on an in-memory runtime: start
// it (init container first), crash its app container twice and watch the
// restart back-off, then kill it.
func Example() {
	ctx := context.Background()
	clk := testingclock.NewFakeClock(time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC))
	rt := podsynctest.New(clk)
	rt.AddImage("busybox:1.36")
	events := &podsynctest.Recorder{}
	syncer, err := podsync.New(podsync.Config{Runtime: rt, Builder: &podsynctest.Builder{}, Events: events, Clock: clk})
	if err != nil {
		panic(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "1234"},
		Spec: corev1.PodSpec{
			RestartPolicy:  corev1.RestartPolicyAlways,
			InitContainers: []corev1.Container{{Name: "setup", Image: "busybox:1.36", ImagePullPolicy: corev1.PullIfNotPresent}},
			Containers:     []corev1.Container{{Name: "app", Image: "busybox:1.36", ImagePullPolicy: corev1.PullIfNotPresent}},
		},
	}
	// One pod worker round: read the runtime, act, report.
	round := func() corev1.PodStatus {
		view, err := podsync.LoadView(ctx, rt, pod.UID, nil)
		if err != nil {
			panic(err)
		}
		syncer.SyncPod(ctx, pod, view)
		view, _ = podsync.LoadView(ctx, rt, pod.UID, nil)
		st := syncer.PodStatus(pod, view, podsync.StatusInput{})
		pod.Status = st
		return st
	}
	show := func(st corev1.PodStatus) {
		app := st.ContainerStatuses[0]
		state := "running"
		if app.State.Waiting != nil {
			state = app.State.Waiting.Reason
		}
		fmt.Printf("phase=%s app=%s restarts=%d\n", st.Phase, state, app.RestartCount)
	}

	show(round()) // sandbox + init container
	_ = rt.Exit(rt.ContainerByName("setup").Id, 0, "", "")
	show(round()) // app starts

	_ = rt.Exit(rt.ContainerByName("app").Id, 1, "", "")
	clk.Step(time.Second)
	show(round()) // first crash: restarted at once
	_ = rt.Exit(rt.ContainerByName("app").Id, 1, "", "")
	clk.Step(time.Second)
	st := round() // second crash: back-off
	show(st)
	fmt.Println(st.ContainerStatuses[0].State.Waiting.Message)
	clk.Step(10 * time.Second)
	show(round())

	syncer.KillPod(ctx, pod, nil, nil)
	for _, e := range events.Strings() {
		fmt.Println(e)
	}
	// Output:
	// phase=Pending app=PodInitializing restarts=0
	// phase=Running app=running restarts=0
	// phase=Running app=running restarts=1
	// phase=Running app=CrashLoopBackOff restarts=1
	// back-off 10s restarting failed container=app pod=web_default(1234)
	// phase=Running app=running restarts=2
	// Normal Pulled Container image "busybox:1.36" already present on machine
	// Normal Created Container created
	// Normal Started Container started
	// Normal Pulled Container image "busybox:1.36" already present on machine
	// Normal Created Container created
	// Normal Started Container started
	// Normal Pulled Container image "busybox:1.36" already present on machine
	// Normal Created Container created
	// Normal Started Container started
	// Warning BackOff Back-off restarting failed container app in pod web_default(1234)
	// Normal Pulled Container image "busybox:1.36" already present on machine
	// Normal Created Container created
	// Normal Started Container started
	// Normal Killing Stopping container app
}

// ComputeActions is pure: feed it a pod and a view to see what the kubelet
// would do next.
func ExampleComputeActions() {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default", UID: "1234"},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "setup", Image: "busybox"}},
			Containers:     []corev1.Container{{Name: "app", Image: "busybox"}},
		},
	}
	a := podsync.ComputeActions(pod, &podsync.PodView{}, podsync.ActionOptions{})
	fmt.Printf("create sandbox=%v attempt=%d init=%v containers=%v\n", a.CreateSandbox, a.Attempt, a.InitContainersToStart, a.ContainersToStart)
	// Output:
	// create sandbox=true attempt=0 init=[0] containers=[]
}
