package downward

import (
	"testing"

	"github.com/stretchr/testify/assert"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

func TestExpand(t *testing.T) {
	vars := Lookup(map[string]string{"VAR_A": "A", "VAR_B": "B", "EMPTY": ""}, map[string]string{"VAR_A": "shadowed", "SVC": "10.0.0.1"})
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"plain", "plain"},
		{"$(VAR_A)", "A"},
		{"___$(VAR_A)___", "___A___"},
		{"$(VAR_A)$(VAR_B)", "AB"},
		{"$(SVC):80", "10.0.0.1:80"},
		{"$(EMPTY)x", "x"},
		{"$(UNKNOWN)", "$(UNKNOWN)"},
		{"$$(VAR_A)", "$(VAR_A)"},
		{"$$$(VAR_A)", "$A"},
		{"$$$$(VAR_A)", "$$(VAR_A)"},
		{"$VAR_A", "$VAR_A"},
		{"$", "$"},
		{"x$", "x$"},
		{"$(VAR_A", "$(VAR_A"},
		{"$(", "$("},
		{"$()", "$()"},
		{"$(VAR_A$(VAR_B))", "$(VAR_A$(VAR_B))"},
		{"$(VAR_A)$", "A$"},
		{"$é", "$é"},
		{"(VAR_A)", "(VAR_A)"},
	} {
		assert.Equal(t, tc.want, Expand(tc.in, vars), "Expand(%q)", tc.in)
	}
}

func TestMetadata(t *testing.T) {
	pod := &corev1.Pod{}
	pod.Name, pod.Namespace, pod.UID = "web", "prod", "uid-1"
	pod.Labels = map[string]string{"b": "2", "a": "1"}
	pod.Annotations = map[string]string{"note": "say \"hi\"\n"}
	for _, tc := range []struct{ path, want, err string }{
		{path: "metadata.name", want: "web"},
		{path: "metadata.namespace", want: "prod"},
		{path: "metadata.uid", want: "uid-1"},
		{path: "metadata.labels", want: "a=\"1\"\nb=\"2\""},
		{path: "metadata.annotations", want: `note="say \"hi\"\n"`},
		{path: "metadata.labels['a']", want: "1"},
		{path: "metadata.labels['missing']", want: ""},
		{path: "metadata.annotations['note']", want: "say \"hi\"\n"},
		{path: "metadata.labels['not valid!']", err: "invalid key subscript in metadata.labels['not valid!']: "},
		{path: "metadata.name['x']", err: `fieldPath "metadata.name['x']" does not support subscript`},
		{path: "spec.restartPolicy", err: "unsupported fieldPath: spec.restartPolicy"},
	} {
		got, err := Metadata(pod, tc.path)
		if tc.err != "" {
			if assert.Error(t, err, tc.path) {
				assert.Contains(t, err.Error(), tc.err)
			}
			continue
		}
		assert.NoError(t, err, tc.path)
		assert.Equal(t, tc.want, got, tc.path)
	}
}

func TestCheckFieldLabel(t *testing.T) {
	for _, tc := range []struct{ version, path, want, err string }{
		{"v1", "metadata.name", "metadata.name", ""},
		{"v1", "spec.host", "spec.nodeName", ""},
		{"v1", "status.podIPs", "status.podIPs", ""},
		{"v1", "metadata.annotations['x']", "metadata.annotations['x']", ""},
		{"v2", "metadata.name", "", "unsupported pod version: v2"},
		{"", "metadata.name", "", "unsupported pod version: "},
		{"v1", "spec.containers", "", "field label not supported: spec.containers"},
		{"v1", "spec.nodeName['x']", "", "field label does not support subscript: spec.nodeName['x']"},
	} {
		got, err := CheckFieldLabel(tc.version, tc.path)
		if tc.err != "" {
			assert.EqualError(t, err, tc.err)
			continue
		}
		assert.NoError(t, err)
		assert.Equal(t, tc.want, got)
	}
}

func TestResourceValue(t *testing.T) {
	q := resource.MustParse
	c := &corev1.Container{Name: "c", Resources: corev1.ResourceRequirements{
		Requests: corev1.ResourceList{"cpu": q("250m"), "memory": q("64Mi"), "hugepages-2Mi": q("4Mi")},
		Limits:   corev1.ResourceList{"memory": q("128Mi")},
	}}
	alloc := corev1.ResourceList{"cpu": q("2"), "memory": q("8Gi"), "ephemeral-storage": q("10Gi")}
	d := DefaultLimits(nil, c, alloc)
	_, hasCPU := c.Resources.Limits["cpu"]
	assert.False(t, hasCPU, "DefaultLimits must copy")
	for _, tc := range []struct {
		res, divisor, want string
	}{
		{"requests.cpu", "", "1"},     // 0.25 rounds up to 1
		{"requests.cpu", "1m", "250"}, // millicores
		{"limits.cpu", "", "2"},       // allocatable default
		{"limits.cpu", "1m", "2000"},
		{"requests.memory", "", "67108864"},
		{"requests.memory", "1Mi", "64"},
		{"limits.memory", "1Mi", "128"}, // set: not defaulted
		{"limits.memory", "1Gi", "1"},   // 0.125 rounds up
		{"limits.ephemeral-storage", "1Gi", "10"},
		{"requests.ephemeral-storage", "", "0"},
		{"requests.hugepages-2Mi", "1Mi", "4"},
		{"limits.hugepages-2Mi", "", "0"},
		{"requests.cpu", "3", "1"},
	} {
		fs := &corev1.ResourceFieldSelector{Resource: tc.res}
		if tc.divisor != "" {
			fs.Divisor = q(tc.divisor)
		}
		got, err := ResourceValue(fs, d)
		assert.NoError(t, err, tc.res)
		assert.Equal(t, tc.want, got, "%s / %s", tc.res, tc.divisor)
	}
	_, err := ResourceValue(&corev1.ResourceFieldSelector{Resource: "limits.nvidia.com/gpu"}, d)
	assert.EqualError(t, err, "unsupported container resource : limits.nvidia.com/gpu")
}

func TestResourceValueRounding(t *testing.T) {
	q := resource.MustParse
	c := &corev1.Container{Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"memory": q("2Ki"), "cpu": q("2.5")}}}
	for _, tc := range []struct{ res, divisor, want string }{
		{"limits.memory", "1m", "2048"}, // upstream rounds the divisor up to 1 byte
		{"limits.cpu", "1", "3"},
		{"limits.cpu", "1n", "2500"}, // 1n is 1m once rounded up to millicores
		{"limits.memory", "3", "683"},
	} {
		got, err := ResourceValue(&corev1.ResourceFieldSelector{Resource: tc.res, Divisor: q(tc.divisor)}, c)
		assert.NoError(t, err)
		assert.Equal(t, tc.want, got, "%s / %s", tc.res, tc.divisor)
	}
}

func TestDefaultLimitsPodLevel(t *testing.T) {
	q := resource.MustParse
	pod := &corev1.Pod{Spec: corev1.PodSpec{Resources: &corev1.ResourceRequirements{Limits: corev1.ResourceList{"cpu": q("500m")}}}}
	c := &corev1.Container{}
	d := DefaultLimits(pod, c, corev1.ResourceList{"cpu": q("4"), "memory": q("1Gi")})
	assert.Equal(t, "500m", d.Resources.Limits.Cpu().String())
	assert.Equal(t, "1Gi", d.Resources.Limits.Memory().String())
}
