// Package downward holds what podenv and volume share to read a pod the way the
// kubelet's downward API does: $(VAR) expansion, metadata field paths and
// container resource values. Both libraries need identical answers, and the
// boundary rule keeps them from importing each other, so the logic lives here.
package downward

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Expand replaces $(NAME) in s with lookup(NAME) when lookup knows the name, as
// the kubelet's forked expansion package does: $$ is a literal $, an unknown
// $(NAME) and an unclosed $( stay as written, and a $ followed by anything else
// is kept with that character.
func Expand(s string, lookup func(name string) (string, bool)) string {
	if !strings.Contains(s, "$") {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	i := 0
	for i < len(s) {
		c := s[i]
		if c != '$' || i+1 == len(s) {
			b.WriteByte(c)
			i++
			continue
		}
		next := s[i+1]
		switch next {
		case '$':
			b.WriteByte('$')
			i += 2
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				// Unclosed: keep "$(" and carry on after it.
				b.WriteString("$(")
				i += 2
				continue
			}
			name := s[i+2 : i+2+end]
			if v, ok := lookup(name); ok {
				b.WriteString(v)
			} else {
				b.WriteString("$(")
				b.WriteString(name)
				b.WriteByte(')')
			}
			i += 2 + end + 1
		default:
			b.WriteByte('$')
			b.WriteByte(next)
			i += 2
		}
	}
	return b.String()
}

// Lookup returns a lookup for Expand that tries each map in order.
func Lookup(maps ...map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		for _, m := range maps {
			if v, ok := m[name]; ok {
				return v, true
			}
		}
		return "", false
	}
}

// SplitSubscript splits `path['key']` into path and key, as upstream's
// fieldpath.SplitMaybeSubscriptedPath.
func SplitSubscript(fieldPath string) (path, key string, ok bool) {
	if !strings.HasSuffix(fieldPath, "']") {
		return fieldPath, "", false
	}
	p, k, found := strings.Cut(strings.TrimSuffix(fieldPath, "']"), "['")
	if !found || p == "" {
		return fieldPath, "", false
	}
	return p, k, true
}

// CheckFieldLabel accepts the field paths the API server lets a pod's downward
// API name (upstream's pods.ConvertDownwardAPIFieldLabel), returning the path to
// read (spec.host becomes spec.nodeName).
func CheckFieldLabel(apiVersion, fieldPath string) (string, error) {
	if apiVersion != "v1" {
		return "", fmt.Errorf("unsupported pod version: %s", apiVersion)
	}
	if path, _, ok := SplitSubscript(fieldPath); ok {
		switch path {
		case "metadata.annotations", "metadata.labels":
			return fieldPath, nil
		}
		return "", fmt.Errorf("field label does not support subscript: %s", fieldPath)
	}
	switch fieldPath {
	case "metadata.annotations", "metadata.labels", "metadata.name", "metadata.namespace",
		"metadata.uid", "spec.nodeName", "spec.restartPolicy", "spec.serviceAccountName",
		"spec.schedulerName", "status.phase", "status.hostIP", "status.hostIPs",
		"status.podIP", "status.podIPs":
		return fieldPath, nil
	case "spec.host":
		return "spec.nodeName", nil
	}
	return "", fmt.Errorf("field label not supported: %s", fieldPath)
}

// Metadata reads a metadata field path of pod as upstream's
// fieldpath.ExtractFieldPathAsString: whole label and annotation maps are
// `key="value"` lines sorted by key; a subscripted key that is absent reads as "".
func Metadata(pod *corev1.Pod, fieldPath string) (string, error) {
	if path, key, ok := SplitSubscript(fieldPath); ok {
		switch path {
		case "metadata.annotations":
			if errs := validation.IsQualifiedName(strings.ToLower(key)); len(errs) != 0 {
				return "", fmt.Errorf("invalid key subscript in %s: %s", fieldPath, strings.Join(errs, ";"))
			}
			return pod.Annotations[key], nil
		case "metadata.labels":
			if errs := validation.IsQualifiedName(key); len(errs) != 0 {
				return "", fmt.Errorf("invalid key subscript in %s: %s", fieldPath, strings.Join(errs, ";"))
			}
			return pod.Labels[key], nil
		}
		return "", fmt.Errorf("fieldPath %q does not support subscript", fieldPath)
	}
	switch fieldPath {
	case "metadata.annotations":
		return FormatMap(pod.Annotations), nil
	case "metadata.labels":
		return FormatMap(pod.Labels), nil
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	}
	return "", fmt.Errorf("unsupported fieldPath: %v", fieldPath)
}

// FormatMap writes m as `key="value"` lines sorted by key, values Go-quoted.
func FormatMap(m map[string]string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(strconv.Quote(m[k]))
	}
	return b.String()
}

// DefaultLimits returns a copy of c whose unset (or zero) cpu, memory and
// ephemeral-storage limits are filled from the pod's own limits where it sets
// them (pod-level resources) and otherwise from the node's allocatable, as the
// kubelet's defaultPodLimitsForDownwardAPI does.
func DefaultLimits(pod *corev1.Pod, c *corev1.Container, allocatable corev1.ResourceList) *corev1.Container {
	defaults := allocatable
	if pod != nil && pod.Spec.Resources != nil && len(pod.Spec.Resources.Limits) > 0 {
		defaults = allocatable.DeepCopy()
		for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if v, ok := pod.Spec.Resources.Limits[name]; ok && !v.IsZero() {
				if _, ok := defaults[name]; ok {
					defaults[name] = v.DeepCopy()
				}
			}
		}
	}
	out := c.DeepCopy()
	if out.Resources.Limits == nil {
		out.Resources.Limits = corev1.ResourceList{}
	}
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage} {
		if q, ok := out.Resources.Limits[name]; ok && !q.IsZero() {
			continue
		}
		if d, ok := defaults[name]; ok {
			out.Resources.Limits[name] = d.DeepCopy()
		}
	}
	return out
}

// FindContainer finds a container, then an init container, of pod by name;
// init says which it was.
func FindContainer(pod *corev1.Pod, name string) (c *corev1.Container, init bool, err error) {
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i], false, nil
		}
	}
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == name {
			return &pod.Spec.InitContainers[i], true, nil
		}
	}
	return nil, false, fmt.Errorf("container %s not found", name)
}

// ResourceValue reads a resourceFieldRef of container c, which must already
// carry its defaulted limits, as v1.37.2's ExtractContainerResourceValue: the
// ceiling of value / divisor (divisor default 1) computed in float64, on
// millicores for CPU and on whole units (each rounded up) for memory,
// ephemeral storage and hugepages.
func ResourceValue(fs *corev1.ResourceFieldSelector, c *corev1.Container) (string, error) {
	divisor := fs.Divisor
	if divisor.Cmp(resource.Quantity{}) == 0 {
		divisor = resource.MustParse("1")
	}
	switch {
	case fs.Resource == "limits.cpu":
		return cpuRatio(c.Resources.Limits.Cpu(), divisor), nil
	case fs.Resource == "limits.memory":
		return unitRatio(c.Resources.Limits.Memory(), divisor), nil
	case fs.Resource == "limits.ephemeral-storage":
		return unitRatio(c.Resources.Limits.StorageEphemeral(), divisor), nil
	case fs.Resource == "requests.cpu":
		return cpuRatio(c.Resources.Requests.Cpu(), divisor), nil
	case fs.Resource == "requests.memory":
		return unitRatio(c.Resources.Requests.Memory(), divisor), nil
	case fs.Resource == "requests.ephemeral-storage":
		return unitRatio(c.Resources.Requests.StorageEphemeral(), divisor), nil
	case strings.HasPrefix(fs.Resource, "requests."+corev1.ResourceHugePagesPrefix):
		return unitRatio(c.Resources.Requests.Name(corev1.ResourceName(strings.TrimPrefix(fs.Resource, "requests.")), resource.BinarySI), divisor), nil
	case strings.HasPrefix(fs.Resource, "limits."+corev1.ResourceHugePagesPrefix):
		return unitRatio(c.Resources.Limits.Name(corev1.ResourceName(strings.TrimPrefix(fs.Resource, "limits.")), resource.BinarySI), divisor), nil
	}
	return "", fmt.Errorf("unsupported container resource : %v", fs.Resource)
}

// cpuRatio and unitRatio keep upstream's float64 arithmetic on purpose: its
// rounding (a 1m divisor of memory counts as 1 byte) is what pods see.
func cpuRatio(q *resource.Quantity, divisor resource.Quantity) string {
	return strconv.FormatInt(int64(math.Ceil(float64(q.MilliValue())/float64(divisor.MilliValue()))), 10)
}

func unitRatio(q *resource.Quantity, divisor resource.Quantity) string {
	return strconv.FormatInt(int64(math.Ceil(float64(q.Value())/float64(divisor.Value()))), 10)
}
