package staticpod

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"reflect"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Annotation keys and values the kubelet puts on static and mirror pods
// (k8s.io/kubernetes/pkg/kubelet/types).
const (
	AnnotationConfigHash   = "kubernetes.io/config.hash"
	AnnotationConfigSource = "kubernetes.io/config.source"
	AnnotationConfigSeen   = "kubernetes.io/config.seen"
	AnnotationConfigMirror = corev1.MirrorPodAnnotationKey // kubernetes.io/config.mirror
	// SourceFile is the config.source value of pods read from a manifest folder.
	SourceFile = "file"
	// SeenTimeFormat is the layout of config.seen (RFC 3339 with fixed nanoseconds).
	SeenTimeFormat = "2006-01-02T15:04:05.000000000Z07:00"
)

// ApplyDefaults applies the kubelet's static pod defaulting to a freshly decoded pod,
// in the kubelet's order:
//
//   - the API's own field defaults (restartPolicy Always, dnsPolicy ClusterFirst,
//     imagePullPolicy, probe timings, ... see setAPIDefaults), which the kubelet's
//     decoder applies before anything else;
//   - UID, when the manifest sets none: ManifestUID(pod, nodeName, path);
//   - name suffixed with "-<lowercased nodeName>", namespace "default" when empty,
//     spec.nodeName, annotation kubernetes.io/config.hash = UID;
//   - a toleration {operator: Exists, effect: NoExecute}, replacing any toleration
//     with the same key, operator, value and effect;
//   - status.phase Pending.
//
// It does not set config.source or config.seen: Load and the Watcher do, because
// config.seen is the time the pod was first seen, not the time it was parsed.
func ApplyDefaults(pod *corev1.Pod, nodeName, path string) {
	setAPIDefaults(pod)
	if pod.UID == "" {
		pod.UID = ManifestUID(pod, nodeName, path)
	}
	pod.Name = pod.Name + "-" + strings.ToLower(nodeName)
	if pod.Namespace == "" {
		pod.Namespace = metav1.NamespaceDefault
	}
	pod.Spec.NodeName = nodeName
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[AnnotationConfigHash] = string(pod.UID)
	addOrUpdateToleration(pod, corev1.Toleration{Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute})
	pod.Status.Phase = corev1.PodPending
}

// ManifestUID returns the UID the loader gives a static pod whose manifest sets none:
// the hex FNV-128a hash of the pod's canonical JSON (after API defaulting, before the
// name suffix and the other static pod defaults), followed by "host:<nodeName>" and
// "file:<path>". The kubelet hashes the same inputs in the same order, but over a dump
// of its internal Pod type, which cannot be reproduced outside k8s.io/kubernetes; so
// the value is stable and deterministic (same manifest, node and path give the same
// UID on every run and machine) but not byte-equal to the kubelet's.
// See upstream/staticpod for the measured comparison.
func ManifestUID(pod *corev1.Pod, nodeName, path string) types.UID {
	h := fnv.New128a()
	// json.Marshal of API structs is deterministic: fields in declaration order, map
	// keys sorted. It cannot fail for a corev1.Pod.
	data, _ := json.Marshal(pod)
	h.Write(data)
	fmt.Fprintf(h, "host:%s", nodeName)
	fmt.Fprintf(h, "file:%s", path)
	return types.UID(hex.EncodeToString(h.Sum(nil)))
}

func addOrUpdateToleration(pod *corev1.Pod, tol corev1.Toleration) {
	var out []corev1.Toleration
	replaced := false
	for i := range pod.Spec.Tolerations {
		existing := pod.Spec.Tolerations[i]
		if tol.MatchToleration(&existing) {
			if reflect.DeepEqual(existing, tol) {
				return
			}
			out = append(out, tol)
			replaced = true
			continue
		}
		out = append(out, existing)
	}
	if !replaced {
		out = append(out, tol)
	}
	pod.Spec.Tolerations = out
}

// setAPIDefaults applies the defaults the API machinery gives a v1 Pod on decoding
// (k8s.io/kubernetes/pkg/apis/core/v1 defaults.go), for the fields a static pod uses.
// The kubelet hashes and runs the defaulted pod, so writing a default explicitly or
// leaving it out gives the same UID. Not covered (feature-gated or exotic volume
// plugins): image volume pull policy, pod-level resources, H2C probe protocol, and the
// defaults of the ISCSI, RBD, AzureDisk, ScaleIO and similar cloud volume sources.
func setAPIDefaults(pod *corev1.Pod) {
	spec := &pod.Spec
	if spec.TerminationGracePeriodSeconds != nil && *spec.TerminationGracePeriodSeconds < 0 {
		one := int64(1)
		spec.TerminationGracePeriodSeconds = &one
	}
	for _, cs := range [][]corev1.Container{spec.Containers, spec.InitContainers} {
		for i := range cs {
			defaultRequestsFromLimits(&cs[i].Resources)
		}
	}
	if spec.EnableServiceLinks == nil {
		enable := corev1.DefaultEnableServiceLinks
		spec.EnableServiceLinks = &enable
	}
	if spec.HostNetwork {
		for _, cs := range [][]corev1.Container{spec.Containers, spec.InitContainers} {
			for i := range cs {
				for j := range cs[i].Ports {
					if cs[i].Ports[j].HostPort == 0 {
						cs[i].Ports[j].HostPort = cs[i].Ports[j].ContainerPort
					}
				}
			}
		}
	}

	if spec.ServiceAccountName == "" {
		spec.ServiceAccountName = spec.DeprecatedServiceAccount
	}
	spec.DeprecatedServiceAccount = spec.ServiceAccountName
	if spec.DNSPolicy == "" {
		spec.DNSPolicy = corev1.DNSClusterFirst
	}
	if spec.RestartPolicy == "" {
		spec.RestartPolicy = corev1.RestartPolicyAlways
	}
	if spec.SecurityContext == nil {
		spec.SecurityContext = &corev1.PodSecurityContext{}
	}
	if spec.TerminationGracePeriodSeconds == nil {
		grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
		spec.TerminationGracePeriodSeconds = &grace
	}
	if spec.SchedulerName == "" {
		spec.SchedulerName = corev1.DefaultSchedulerName
	}

	for i := range spec.Volumes {
		defaultVolume(&spec.Volumes[i])
	}
	for i := range spec.Containers {
		defaultContainer(&spec.Containers[i])
	}
	for i := range spec.InitContainers {
		defaultContainer(&spec.InitContainers[i])
	}
	for i := range spec.EphemeralContainers {
		c := corev1.Container(spec.EphemeralContainers[i].EphemeralContainerCommon)
		defaultContainer(&c)
		spec.EphemeralContainers[i].EphemeralContainerCommon = corev1.EphemeralContainerCommon(c)
	}

	st := &pod.Status
	switch {
	case st.PodIP != "" && len(st.PodIPs) == 0:
		st.PodIPs = []corev1.PodIP{{IP: st.PodIP}}
	case st.PodIP == "" && len(st.PodIPs) > 0:
		st.PodIP = st.PodIPs[0].IP
	case st.PodIP != "" && st.PodIPs[0].IP != st.PodIP:
		st.PodIPs = []corev1.PodIP{{IP: st.PodIP}}
	}
}

func defaultRequestsFromLimits(r *corev1.ResourceRequirements) {
	if r.Limits == nil {
		return
	}
	if r.Requests == nil {
		r.Requests = corev1.ResourceList{}
	}
	for name, q := range r.Limits {
		if _, ok := r.Requests[name]; !ok {
			r.Requests[name] = q.DeepCopy()
		}
	}
}

func defaultVolume(v *corev1.Volume) {
	if reflect.ValueOf(v.VolumeSource).IsZero() {
		v.EmptyDir = &corev1.EmptyDirVolumeSource{}
	}
	if v.HostPath != nil && v.HostPath.Type == nil {
		unset := corev1.HostPathUnset
		v.HostPath.Type = &unset
	}
	if s := v.Secret; s != nil && s.DefaultMode == nil {
		s.DefaultMode = ptrInt32(corev1.SecretVolumeSourceDefaultMode)
	}
	if c := v.ConfigMap; c != nil && c.DefaultMode == nil {
		c.DefaultMode = ptrInt32(corev1.ConfigMapVolumeSourceDefaultMode)
	}
	if d := v.DownwardAPI; d != nil {
		if d.DefaultMode == nil {
			d.DefaultMode = ptrInt32(corev1.DownwardAPIVolumeSourceDefaultMode)
		}
		for i := range d.Items {
			defaultFieldRef(d.Items[i].FieldRef)
		}
	}
	if p := v.Projected; p != nil {
		if p.DefaultMode == nil {
			p.DefaultMode = ptrInt32(corev1.ProjectedVolumeSourceDefaultMode)
		}
		for i := range p.Sources {
			if s := p.Sources[i].ServiceAccountToken; s != nil && s.ExpirationSeconds == nil {
				hour := int64(3600)
				s.ExpirationSeconds = &hour
			}
			if d := p.Sources[i].DownwardAPI; d != nil {
				for j := range d.Items {
					defaultFieldRef(d.Items[j].FieldRef)
				}
			}
		}
	}
}

func defaultContainer(c *corev1.Container) {
	if c.ImagePullPolicy == "" {
		if imageTag(c.Image) == "latest" {
			c.ImagePullPolicy = corev1.PullAlways
		} else {
			c.ImagePullPolicy = corev1.PullIfNotPresent
		}
	}
	if c.TerminationMessagePath == "" {
		c.TerminationMessagePath = corev1.TerminationMessagePathDefault
	}
	if c.TerminationMessagePolicy == "" {
		c.TerminationMessagePolicy = corev1.TerminationMessageReadFile
	}
	for i := range c.Ports {
		if c.Ports[i].Protocol == "" {
			c.Ports[i].Protocol = corev1.ProtocolTCP
		}
	}
	for i := range c.Env {
		if c.Env[i].ValueFrom != nil {
			defaultFieldRef(c.Env[i].ValueFrom.FieldRef)
		}
	}
	for _, p := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
		if p == nil {
			continue
		}
		if p.TimeoutSeconds == 0 {
			p.TimeoutSeconds = 1
		}
		if p.PeriodSeconds == 0 {
			p.PeriodSeconds = 10
		}
		if p.SuccessThreshold == 0 {
			p.SuccessThreshold = 1
		}
		if p.FailureThreshold == 0 {
			p.FailureThreshold = 3
		}
		defaultHTTPGet(p.HTTPGet)
	}
	if l := c.Lifecycle; l != nil {
		if l.PostStart != nil {
			defaultHTTPGet(l.PostStart.HTTPGet)
		}
		if l.PreStop != nil {
			defaultHTTPGet(l.PreStop.HTTPGet)
		}
	}
}

func defaultHTTPGet(h *corev1.HTTPGetAction) {
	if h == nil {
		return
	}
	if h.Path == "" {
		h.Path = "/"
	}
	if h.Scheme == "" {
		h.Scheme = corev1.URISchemeHTTP
	}
}

func defaultFieldRef(f *corev1.ObjectFieldSelector) {
	if f != nil && f.APIVersion == "" {
		f.APIVersion = "v1"
	}
}

// imageTag returns an image reference's tag: "latest" when it has neither a tag nor
// a digest, "" when it has only a digest.
func imageTag(image string) string {
	name, digest, hasDigest := strings.Cut(image, "@")
	_ = digest
	lastSlash := strings.LastIndex(name, "/")
	if colon := strings.LastIndex(name, ":"); colon > lastSlash {
		return name[colon+1:]
	}
	if hasDigest {
		return ""
	}
	return "latest"
}

func ptrInt32(v int32) *int32 { return &v }
