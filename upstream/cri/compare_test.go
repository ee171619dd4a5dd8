// Package cri_test checks nodekit's cri package against the kubelet's own code
// (k8s.io/kubernetes v1.37.2): the container hash annotation and the runtime
// readiness message must be byte-identical, or a kubelet taking over a node would
// restart nodekit's containers, and the Ready condition would read differently.
package cri_test

import (
	"fmt"
	"strconv"
	"testing"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	kubecontainer "k8s.io/kubernetes/pkg/kubelet/container"
	"k8s.io/kubernetes/pkg/securitycontext"
	"k8s.io/utils/ptr"

	"github.com/nodekit-dev/nodekit/cri"
)

func TestContainerHashMatchesKubelet(t *testing.T) {
	containers := []corev1.Container{
		{Name: "nginx", Image: "docker.io/library/nginx:1.27"},
		{Name: "main", Image: "registry.k8s.io/pause:3.10.2", Args: []string{"ignored"}},
		{Name: "a-very-long-container-name-with-dashes", Image: "127.0.0.1:5000/nodekit/busybox@sha256:" + fmt.Sprintf("%064x", 42)},
		{Name: "x", Image: ""},
	}
	for _, c := range containers {
		t.Run(c.Name, func(t *testing.T) {
			want := kubecontainer.HashContainer(&c)
			got := cri.ContainerHash(&c)
			if got != want {
				t.Errorf("ContainerHash = %s, kubelet's = %s", strconv.FormatUint(got, 16), strconv.FormatUint(want, 16))
			}
		})
	}
}

// The kubelet builds the Ready message from kubecontainer.RuntimeCondition.String and an
// aggregate of the runtime and network errors (pkg/kubelet/kubelet.go updateRuntimeUp,
// runtime.go, nodestatus/setters.go). This rebuilds it with the kubelet's own types.
func kubeletMessage(st *runtimeapi.RuntimeStatus) string {
	var runtimeCond, networkCond *kubecontainer.RuntimeCondition
	for _, c := range st.GetConditions() {
		kc := &kubecontainer.RuntimeCondition{Type: kubecontainer.RuntimeConditionType(c.Type), Status: c.Status, Reason: c.Reason, Message: c.Message}
		switch c.Type {
		case runtimeapi.RuntimeReady:
			runtimeCond = kc
		case runtimeapi.NetworkReady:
			networkCond = kc
		}
	}
	var errs []error
	if runtimeCond == nil || !runtimeCond.Status {
		errs = append(errs, fmt.Errorf("container runtime not ready: %v", runtimeCond))
	}
	if networkCond == nil || !networkCond.Status {
		errs = append(errs, fmt.Errorf("container runtime network not ready: %v", networkCond))
	}
	if agg := utilerrors.NewAggregate(errs); agg != nil {
		return agg.Error()
	}
	return "kubelet is posting ready status"
}

func TestReadinessMessageMatchesKubelet(t *testing.T) {
	noCNI := &runtimeapi.RuntimeCondition{Type: runtimeapi.NetworkReady, Reason: "NetworkPluginNotReady", Message: "Network plugin returns error: cni plugin not initialized"}
	runtimeOK := &runtimeapi.RuntimeCondition{Type: runtimeapi.RuntimeReady, Status: true}
	networkOK := &runtimeapi.RuntimeCondition{Type: runtimeapi.NetworkReady, Status: true}
	runtimeDown := &runtimeapi.RuntimeCondition{Type: runtimeapi.RuntimeReady, Reason: "X", Message: "y"}
	for name, conds := range map[string][]*runtimeapi.RuntimeCondition{
		"ready":         {runtimeOK, networkOK},
		"no CNI":        {runtimeOK, noCNI},
		"both down":     {runtimeDown, noCNI},
		"no conditions": nil,
		"only runtime":  {runtimeOK},
	} {
		t.Run(name, func(t *testing.T) {
			st := &runtimeapi.RuntimeStatus{Conditions: conds}
			if got, want := cri.ReadinessFromStatus(st).Message, kubeletMessage(st); got != want {
				t.Errorf("message\n got: %s\nwant: %s", got, want)
			}
		})
	}
}

// TestContainerResourcesMatchKubelet compares ContainerConfig's Linux resources with
// the kubelet's own conversions (pkg/kubelet/cm), as calculateLinuxResources applies
// them: shares from the CPU request (the limit when there is no request), the CFS
// quota from the limit over cm.QuotaPeriod, the memory limit as is.
func TestContainerResourcesMatchKubelet(t *testing.T) {
	millis := []int64{0, 1, 2, 3, 5, 9, 10, 11, 99, 100, 101, 250, 333, 999, 1000, 1001, 1500, 4000, 64000, 256000, 262144, 300000}
	for _, request := range append([]int64{-1}, millis...) { // -1: no request
		for _, limit := range millis {
			if request > limit && limit != 0 {
				continue // invalid: a request above its limit
			}
			c := corev1.Container{Name: "main", Image: "busybox", Resources: corev1.ResourceRequirements{
				Limits: corev1.ResourceList{corev1.ResourceMemory: *resource.NewQuantity(limit<<20, resource.BinarySI)},
			}}
			if limit != 0 {
				c.Resources.Limits[corev1.ResourceCPU] = *resource.NewMilliQuantity(limit, resource.DecimalSI)
			}
			shareBasis := limit
			if request >= 0 {
				c.Resources.Requests = corev1.ResourceList{corev1.ResourceCPU: *resource.NewMilliQuantity(request, resource.DecimalSI)}
				shareBasis = request
			}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u"}, Spec: corev1.PodSpec{Containers: []corev1.Container{c}}}
			cfg, err := cri.ContainerConfig(pod, "main", 0, "")
			if err != nil {
				t.Fatal(err)
			}
			got := cfg.GetLinux().GetResources()
			want := &runtimeapi.LinuxContainerResources{
				CpuShares:          int64(cm.MilliCPUToShares(shareBasis)),
				CpuQuota:           cm.MilliCPUToQuota(limit, int64(cm.QuotaPeriod)),
				CpuPeriod:          int64(cm.QuotaPeriod),
				MemoryLimitInBytes: limit << 20,
			}
			if !proto.Equal(got, want) {
				t.Errorf("request %dm limit %dm: got %v, kubelet's %v", request, limit, got, want)
			}
		}
	}
}

// TestNoNewPrivsMatchesKubelet compares no_new_privs with the kubelet's
// securitycontext.AddNoNewPrivileges over the effective security context.
func TestNoNewPrivsMatchesKubelet(t *testing.T) {
	for _, allow := range []*bool{nil, ptr.To(true), ptr.To(false)} {
		for _, withSC := range []bool{false, true} {
			c := corev1.Container{Name: "main", Image: "busybox"}
			if withSC {
				c.SecurityContext = &corev1.SecurityContext{AllowPrivilegeEscalation: allow}
			}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u"}, Spec: corev1.PodSpec{Containers: []corev1.Container{c}}}
			cfg, err := cri.ContainerConfig(pod, "main", 0, "")
			if err != nil {
				t.Fatal(err)
			}
			want := securitycontext.AddNoNewPrivileges(securitycontext.DetermineEffectiveSecurityContext(pod, &c))
			if got := cfg.GetLinux().GetSecurityContext().GetNoNewPrivs(); got != want {
				t.Errorf("allowPrivilegeEscalation %v (security context %v): no_new_privs %v, kubelet's %v", allow, withSC, got, want)
			}
		}
	}
}
