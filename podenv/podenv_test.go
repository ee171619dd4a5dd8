package podenv_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/utils/ptr"

	"github.com/nodekit-dev/nodekit/podenv"
	"github.com/nodekit-dev/nodekit/podenv/podenvtest"
)

func svc(ns, name, ip string, ports ...corev1.ServicePort) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       corev1.ServiceSpec{ClusterIP: ip, Ports: ports},
	}
}

func port(name string, p int32, proto corev1.Protocol) corev1.ServicePort {
	return corev1.ServicePort{Name: name, Port: p, Protocol: proto}
}

func cm(ns, name string, data map[string]string) *corev1.ConfigMap {
	return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: data}
}

func secret(ns, name string, data map[string]string) *corev1.Secret {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string][]byte{}}
	for k, v := range data {
		s.Data[k] = []byte(v)
	}
	return s
}

func testPod(ns string, links bool, c corev1.Container) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: ns, Name: "web-0", UID: "0b7c5e0a-uid",
			Labels:      map[string]string{"app": "web", "tier": "front"},
			Annotations: map[string]string{"owner": "team-a"},
		},
		Spec: corev1.PodSpec{
			NodeName:           "node-1",
			ServiceAccountName: "builder",
			EnableServiceLinks: ptr.To(links),
			Containers:         []corev1.Container{c},
		},
	}
}

// masterAndLocal is the service set most cases run against: the master service,
// two services in the pod's namespace (one headless) and one elsewhere.
func masterAndLocal() []any {
	return []any{
		svc("default", "kubernetes", "10.96.0.1", port("https", 443, corev1.ProtocolTCP)),
		svc("default", "other-default", "10.96.0.9", port("", 80, "")),
		svc("prod", "web-api", "10.96.3.4", port("http", 80, corev1.ProtocolTCP), port("dns", 53, corev1.ProtocolUDP)),
		svc("prod", "headless", corev1.ClusterIPNone, port("", 80, "")),
		svc("prod", "pending", "", port("", 80, "")),
		svc("other", "elsewhere", "10.96.7.7", port("", 8080, "")),
	}
}

var masterVars = []string{
	"KUBERNETES_PORT=tcp://10.96.0.1:443",
	"KUBERNETES_PORT_443_TCP=tcp://10.96.0.1:443",
	"KUBERNETES_PORT_443_TCP_ADDR=10.96.0.1",
	"KUBERNETES_PORT_443_TCP_PORT=443",
	"KUBERNETES_PORT_443_TCP_PROTO=tcp",
	"KUBERNETES_SERVICE_HOST=10.96.0.1",
	"KUBERNETES_SERVICE_PORT=443",
	"KUBERNETES_SERVICE_PORT_HTTPS=443",
}

var webAPIVars = []string{
	"WEB_API_PORT=tcp://10.96.3.4:80",
	"WEB_API_PORT_53_UDP=udp://10.96.3.4:53",
	"WEB_API_PORT_53_UDP_ADDR=10.96.3.4",
	"WEB_API_PORT_53_UDP_PORT=53",
	"WEB_API_PORT_53_UDP_PROTO=udp",
	"WEB_API_PORT_80_TCP=tcp://10.96.3.4:80",
	"WEB_API_PORT_80_TCP_ADDR=10.96.3.4",
	"WEB_API_PORT_80_TCP_PORT=80",
	"WEB_API_PORT_80_TCP_PROTO=tcp",
	"WEB_API_SERVICE_HOST=10.96.3.4",
	"WEB_API_SERVICE_PORT=80",
	"WEB_API_SERVICE_PORT_DNS=53",
	"WEB_API_SERVICE_PORT_HTTP=80",
}

func flat(kvs []*runtimeapi.KeyValue) []string {
	out := make([]string, 0, len(kvs))
	for _, kv := range kvs {
		out = append(out, kv.Key+"="+string(kv.Value))
	}
	return out
}

func join(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func TestEnv(t *testing.T) {
	q := resource.MustParse
	alloc := corev1.ResourceList{"cpu": q("4"), "memory": q("8Gi"), "ephemeral-storage": q("100Gi")}
	objects := append(masterAndLocal(),
		cm("prod", "settings", map[string]string{"LOG_LEVEL": "debug", "REGION": "eu", "URL": "http://$(WEB_API_SERVICE_HOST)"}),
		cm("prod", "more", map[string]string{"REGION": "us"}),
		secret("prod", "creds", map[string]string{"PASSWORD": "hunter2", "USER": "admin"}),
	)
	fieldRef := func(path string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: path}}
	}
	resRef := func(res, divisor string) *corev1.EnvVarSource {
		s := &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: res}}
		if divisor != "" {
			s.ResourceFieldRef.Divisor = q(divisor)
		}
		return s
	}
	cmKey := func(name, key string, optional *bool) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key, Optional: optional}}
	}
	secKey := func(name, key string, optional *bool) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key, Optional: optional}}
	}

	for _, tc := range []struct {
		name      string
		ns        string
		links     bool
		container corev1.Container
		podIPs    []string
		hostIPs   []string
		want      []string // exact list, in order
		wantErr   string
		errIs     error
	}{{
		name: "links on: local services and master, sorted after the container's own", ns: "prod", links: true,
		container: corev1.Container{Env: []corev1.EnvVar{{Name: "A", Value: "1"}}},
		want:      join([]string{"A=1"}, masterVars, webAPIVars),
	}, {
		name: "links off: only the master service", ns: "prod", links: false,
		want: masterVars,
	}, {
		name: "default namespace, links off: master only, not other-default", ns: "default", links: false,
		want: masterVars,
	}, {
		name: "default namespace, links on: every default service", ns: "default", links: true,
		want: join(masterVars, []string{
			"OTHER_DEFAULT_PORT=tcp://10.96.0.9:80",
			"OTHER_DEFAULT_PORT_80_TCP=tcp://10.96.0.9:80",
			"OTHER_DEFAULT_PORT_80_TCP_ADDR=10.96.0.9",
			"OTHER_DEFAULT_PORT_80_TCP_PORT=80",
			"OTHER_DEFAULT_PORT_80_TCP_PROTO=tcp",
			"OTHER_DEFAULT_SERVICE_HOST=10.96.0.9",
			"OTHER_DEFAULT_SERVICE_PORT=80",
		}),
	}, {
		name: "a container variable hides the service variable of the same name", ns: "prod", links: false,
		container: corev1.Container{Env: []corev1.EnvVar{{Name: "KUBERNETES_SERVICE_HOST", Value: "override"}}},
		want:      join([]string{"KUBERNETES_SERVICE_HOST=override"}, masterVars[:5], masterVars[6:]),
	}, {
		name: "expansion: earlier vars, service vars, escapes, unknown and later vars stay", ns: "prod", links: true,
		container: corev1.Container{Env: []corev1.EnvVar{
			{Name: "HOST", Value: "$(WEB_API_SERVICE_HOST)"},
			{Name: "URL", Value: "http://$(HOST):$(WEB_API_SERVICE_PORT)/$(LATER)"},
			{Name: "LATER", Value: "late"},
			{Name: "ESC", Value: "$$(HOST) $HOST $(NOPE) $(HOST"},
		}},
		want: join([]string{
			"HOST=10.96.3.4",
			"URL=http://10.96.3.4:80/$(LATER)",
			"LATER=late",
			"ESC=$(HOST) $HOST $(NOPE) $(HOST",
		}, masterVars, webAPIVars),
	}, {
		name: "envFrom: prefixes, later sources win, env wins over envFrom, values not expanded", ns: "prod", links: false,
		container: corev1.Container{
			EnvFrom: []corev1.EnvFromSource{
				{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}},
				{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "more"}}},
				{Prefix: "DB_", SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}}},
				{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}, Optional: ptr.To(true)}},
			},
			Env: []corev1.EnvVar{{Name: "LOG_LEVEL", Value: "info"}, {Name: "WHERE", Value: "$(REGION)/$(DB_USER)"}},
		},
		want: join([]string{
			"REGION=us",
			"URL=http://$(WEB_API_SERVICE_HOST)",
			"DB_PASSWORD=hunter2",
			"DB_USER=admin",
			"LOG_LEVEL=info",
			"WHERE=us/admin",
		}, masterVars),
	}, {
		name: "fieldRef: every path the kubelet answers", ns: "prod", links: false,
		podIPs: []string{"10.244.1.5", "fd00::5"}, hostIPs: []string{"192.168.1.10", "fd00::10"},
		container: corev1.Container{Env: []corev1.EnvVar{
			{Name: "NAME", ValueFrom: fieldRef("metadata.name")},
			{Name: "NS", ValueFrom: fieldRef("metadata.namespace")},
			{Name: "UID", ValueFrom: fieldRef("metadata.uid")},
			{Name: "LABELS", ValueFrom: fieldRef("metadata.labels")},
			{Name: "APP", ValueFrom: fieldRef("metadata.labels['app']")},
			{Name: "NOLABEL", ValueFrom: fieldRef("metadata.labels['missing']")},
			{Name: "OWNER", ValueFrom: fieldRef("metadata.annotations['owner']")},
			{Name: "ANNOTATIONS", ValueFrom: fieldRef("metadata.annotations")},
			{Name: "NODE", ValueFrom: fieldRef("spec.nodeName")},
			{Name: "HOST_COMPAT", ValueFrom: fieldRef("spec.host")},
			{Name: "SA", ValueFrom: fieldRef("spec.serviceAccountName")},
			{Name: "HOST_IP", ValueFrom: fieldRef("status.hostIP")},
			{Name: "HOST_IPS", ValueFrom: fieldRef("status.hostIPs")},
			{Name: "POD_IP", ValueFrom: fieldRef("status.podIP")},
			{Name: "POD_IPS", ValueFrom: fieldRef("status.podIPs")},
			{Name: "EMPTY"},
		}},
		want: join([]string{
			"NAME=web-0", "NS=prod", "UID=0b7c5e0a-uid",
			"LABELS=app=\"web\"\ntier=\"front\"", "APP=web", "NOLABEL=", "OWNER=team-a",
			"ANNOTATIONS=owner=\"team-a\"", "NODE=node-1", "HOST_COMPAT=node-1", "SA=builder",
			"HOST_IP=192.168.1.10", "HOST_IPS=192.168.1.10,fd00::10",
			"POD_IP=10.244.1.5", "POD_IPS=10.244.1.5,fd00::5", "EMPTY=",
		}, masterVars),
	}, {
		name: "fieldRef pod IP before the sandbox has one is empty", ns: "prod", links: false,
		container: corev1.Container{Env: []corev1.EnvVar{{Name: "POD_IP", ValueFrom: fieldRef("status.podIP")}}},
		want:      join([]string{"POD_IP="}, masterVars),
	}, {
		name: "resourceFieldRef with divisors and allocatable defaults", ns: "prod", links: false,
		container: corev1.Container{
			Name: "app",
			Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{"cpu": q("250m"), "memory": q("100Mi")},
				Limits:   corev1.ResourceList{"memory": q("200Mi")},
			},
			Env: []corev1.EnvVar{
				{Name: "CPU_REQ", ValueFrom: resRef("requests.cpu", "")},
				{Name: "CPU_REQ_M", ValueFrom: resRef("requests.cpu", "1m")},
				{Name: "CPU_LIM", ValueFrom: resRef("limits.cpu", "")},
				{Name: "MEM_REQ", ValueFrom: resRef("requests.memory", "")},
				{Name: "MEM_LIM_MI", ValueFrom: resRef("limits.memory", "1Mi")},
				{Name: "EPH_LIM_GI", ValueFrom: resRef("limits.ephemeral-storage", "1Gi")},
			},
		},
		want: join([]string{"CPU_REQ=1", "CPU_REQ_M=250", "CPU_LIM=4", "MEM_REQ=104857600", "MEM_LIM_MI=200", "EPH_LIM_GI=100"}, masterVars),
	}, {
		name: "configMapKeyRef and secretKeyRef, optional misses leave the variable out", ns: "prod", links: false,
		container: corev1.Container{Env: []corev1.EnvVar{
			{Name: "LEVEL", ValueFrom: cmKey("settings", "LOG_LEVEL", nil)},
			{Name: "PW", ValueFrom: secKey("creds", "PASSWORD", ptr.To(false))},
			{Name: "NO_KEY", ValueFrom: cmKey("settings", "nope", ptr.To(true))},
			{Name: "NO_CM", ValueFrom: cmKey("absent", "x", ptr.To(true))},
			{Name: "NO_SECRET_KEY", ValueFrom: secKey("creds", "nope", ptr.To(true))},
			{Name: "NO_SECRET", ValueFrom: secKey("absent", "x", ptr.To(true))},
		}},
		want: join([]string{"LEVEL=debug", "PW=hunter2"}, masterVars),
	}, {
		name: "missing configMap", ns: "prod", links: false,
		container: corev1.Container{Env: []corev1.EnvVar{{Name: "X", ValueFrom: cmKey("absent", "x", nil)}}},
		wantErr:   `configmap "absent" not found`, errIs: podenv.ErrNotFound,
	}, {
		name: "missing secret", ns: "prod", links: false,
		container: corev1.Container{Env: []corev1.EnvVar{{Name: "X", ValueFrom: secKey("absent", "x", nil)}}},
		wantErr:   `secret "absent" not found`, errIs: podenv.ErrNotFound,
	}, {
		name: "missing envFrom configMap", ns: "prod", links: false,
		container: corev1.Container{EnvFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}}}}},
		wantErr:   `configmap "absent" not found`, errIs: podenv.ErrNotFound,
	}, {
		name: "missing envFrom secret", ns: "prod", links: false,
		container: corev1.Container{EnvFrom: []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "absent"}}}}},
		wantErr:   `secret "absent" not found`, errIs: podenv.ErrNotFound,
	}, {
		name: "missing configMap key", ns: "prod", links: false,
		container: corev1.Container{Env: []corev1.EnvVar{{Name: "X", ValueFrom: cmKey("settings", "nope", nil)}}},
		wantErr:   "couldn't find key nope in ConfigMap prod/settings", errIs: podenv.ErrMissingKey,
	}, {
		name: "missing secret key", ns: "prod", links: false,
		container: corev1.Container{Env: []corev1.EnvVar{{Name: "X", ValueFrom: secKey("creds", "nope", nil)}}},
		wantErr:   "couldn't find key nope in Secret prod/creds", errIs: podenv.ErrMissingKey,
	}, {
		name: "fieldRef with an unsupported api version", ns: "prod", links: false,
		container: corev1.Container{Env: []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v2", FieldPath: "metadata.name"}}}}},
		wantErr:   "unsupported pod version: v2", errIs: podenv.ErrInvalidFieldRef,
	}, {
		name: "fieldRef the API accepts but the kubelet cannot answer", ns: "prod", links: false,
		container: corev1.Container{Env: []corev1.EnvVar{{Name: "X", ValueFrom: fieldRef("spec.restartPolicy")}}},
		wantErr:   "unsupported fieldPath: spec.restartPolicy", errIs: podenv.ErrInvalidFieldRef,
	}, {
		name: "fieldRef unknown field", ns: "prod", links: false,
		container: corev1.Container{Env: []corev1.EnvVar{{Name: "X", ValueFrom: fieldRef("spec.containers")}}},
		wantErr:   "field label not supported: spec.containers", errIs: podenv.ErrInvalidFieldRef,
	}, {
		name: "status.hostIP unknown", ns: "prod", links: false,
		container: corev1.Container{Env: []corev1.EnvVar{{Name: "X", ValueFrom: fieldRef("status.hostIP")}}},
		wantErr:   "host IP unknown; known addresses: []", errIs: podenv.ErrInvalidFieldRef,
	}, {
		name: "resourceFieldRef unsupported resource", ns: "prod", links: false,
		container: corev1.Container{Env: []corev1.EnvVar{{Name: "X", ValueFrom: resRef("limits.example.com/gpu", "")}}},
		wantErr:   "unsupported container resource : limits.example.com/gpu", errIs: podenv.ErrInvalidFieldRef,
	}, {
		name: "resourceFieldRef of an unknown container", ns: "prod", links: false,
		container: corev1.Container{Env: []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "ghost", Resource: "limits.cpu"}}}}},
		wantErr:   "container ghost not found", errIs: podenv.ErrInvalidFieldRef,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := podenv.New(podenv.Config{Source: podenvtest.New(objects...), NodeAllocatable: alloc})
			require.NoError(t, err)
			pod := testPod(tc.ns, tc.links, tc.container)
			got, err := b.Env(context.Background(), pod, &pod.Spec.Containers[0], tc.podIPs, tc.hostIPs)
			if tc.wantErr != "" {
				require.Error(t, err)
				assert.Equal(t, tc.wantErr, err.Error())
				assert.ErrorIs(t, err, tc.errIs)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, flat(got))
		})
	}
}

func TestEnvResourceFieldRefOfAnotherContainer(t *testing.T) {
	q := resource.MustParse
	b, err := podenv.New(podenv.Config{Source: podenvtest.New(), NodeAllocatable: corev1.ResourceList{"memory": q("1Gi")}})
	require.NoError(t, err)
	pod := testPod("prod", false, corev1.Container{Name: "app", Env: []corev1.EnvVar{
		{Name: "SIDE_MEM", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "side", Resource: "limits.memory", Divisor: q("1Mi")}}},
		{Name: "INIT_CPU", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "init", Resource: "requests.cpu", Divisor: q("1m")}}},
		// The kubelet defaults the limits of app containers only: a named init
		// container's unset limit reads 0.
		{Name: "INIT_MEM_LIMIT", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{ContainerName: "init", Resource: "limits.memory"}}},
		{Name: "OWN_MEM_LIMIT", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory", Divisor: q("1Mi")}}},
	}})
	pod.Spec.Containers = append(pod.Spec.Containers, corev1.Container{Name: "side"})
	pod.Spec.InitContainers = []corev1.Container{{Name: "init", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{"cpu": q("100m")}}}}
	got, err := b.Env(context.Background(), pod, &pod.Spec.Containers[0], nil, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"SIDE_MEM=1024", "INIT_CPU=100", "INIT_MEM_LIMIT=0", "OWN_MEM_LIMIT=1024"}, flat(got))
}

func TestEnvLocalServiceNamedKubernetesWinsWithLinks(t *testing.T) {
	src := podenvtest.New(
		svc("default", "kubernetes", "10.96.0.1", port("https", 443, corev1.ProtocolTCP)),
		svc("prod", "kubernetes", "10.96.5.5", port("", 8443, "")),
	)
	b, err := podenv.New(podenv.Config{Source: src})
	require.NoError(t, err)
	for links, wantHost := range map[bool]string{true: "10.96.5.5", false: "10.96.0.1"} {
		pod := testPod("prod", links, corev1.Container{})
		got, err := b.Env(context.Background(), pod, &pod.Spec.Containers[0], nil, nil)
		require.NoError(t, err)
		assert.Contains(t, flat(got), "KUBERNETES_SERVICE_HOST="+wantHost, "links=%v", links)
	}
}

func TestEnvFetchesEachObjectOnce(t *testing.T) {
	src := podenvtest.New(cm("prod", "settings", map[string]string{"A": "1", "B": "2"}))
	b, err := podenv.New(podenv.Config{Source: src})
	require.NoError(t, err)
	ref := func(k string) *corev1.EnvVarSource {
		return &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}, Key: k}}
	}
	pod := testPod("prod", true, corev1.Container{
		EnvFrom: []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}}}},
		Env:     []corev1.EnvVar{{Name: "X", ValueFrom: ref("A")}, {Name: "Y", ValueFrom: ref("B")}},
	})
	_, err = b.Env(context.Background(), pod, &pod.Spec.Containers[0], nil, nil)
	require.NoError(t, err)
	assert.Equal(t, []string{"services default", "services prod", "configmap prod/settings"}, src.Calls())
}

func TestEnvSourceErrors(t *testing.T) {
	boom := errors.New("connection refused")
	src := podenvtest.New(cm("prod", "settings", map[string]string{"A": "1"}))
	b, err := podenv.New(podenv.Config{Source: src})
	require.NoError(t, err)
	pod := testPod("prod", true, corev1.Container{Env: []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{
		ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}, Key: "A", Optional: ptr.To(true)}}}}})

	src.Err = boom
	_, err = b.Env(context.Background(), pod, &pod.Spec.Containers[0], nil, nil)
	require.Error(t, err)
	assert.ErrorIs(t, err, podenv.ErrSource)
	assert.ErrorIs(t, err, boom)
	assert.Contains(t, err.Error(), "failed to list services when setting up env vars")

	// An optional reference does not hide a failing source: only NotFound is optional.
	pod.Spec.EnableServiceLinks = ptr.To(false)
	flaky := &failOn{Source: podenvtest.New(svc("default", "kubernetes", "10.96.0.1", port("", 443, ""))), configMapErr: boom}
	b2, err := podenv.New(podenv.Config{Source: flaky})
	require.NoError(t, err)
	_, err = b2.Env(context.Background(), pod, &pod.Spec.Containers[0], nil, nil)
	require.Error(t, err)
	assert.ErrorIs(t, err, boom)
	assert.Equal(t, "couldn't get configMap prod/settings: connection refused", err.Error())

	// A cancelled context reaches the source.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	src.Err = nil
	_, err = b.Env(ctx, pod, &pod.Spec.Containers[0], nil, nil)
	assert.ErrorIs(t, err, context.Canceled)
}

type failOn struct {
	*podenvtest.Source
	configMapErr error
}

func (f *failOn) ConfigMap(ctx context.Context, ns, name string) (*corev1.ConfigMap, error) {
	return nil, f.configMapErr
}

func TestEnvBadInput(t *testing.T) {
	b, err := podenv.New(podenv.Config{Source: podenvtest.New()})
	require.NoError(t, err)
	pod := testPod("prod", true, corev1.Container{})
	pod.Spec.EnableServiceLinks = nil
	_, err = b.Env(context.Background(), pod, &pod.Spec.Containers[0], nil, nil)
	assert.EqualError(t, err, "nil pod.spec.enableServiceLinks encountered, cannot construct envvars")
	_, err = b.Env(context.Background(), nil, nil, nil, nil)
	assert.Error(t, err)

	_, err = podenv.New(podenv.Config{})
	assert.ErrorIs(t, err, podenv.ErrInvalidConfig)
}

func TestServiceVars(t *testing.T) {
	s := svc("prod", "foo", "10.0.0.11", port("http", 80, corev1.ProtocolTCP), port("metrics", 9090, ""), port("", 443, corev1.ProtocolSCTP))
	var got []string
	for _, kv := range podenv.ServiceVars(s) {
		got = append(got, kv[0]+"="+kv[1])
	}
	assert.Equal(t, []string{
		"FOO_SERVICE_HOST=10.0.0.11",
		"FOO_SERVICE_PORT=80",
		"FOO_SERVICE_PORT_HTTP=80",
		"FOO_SERVICE_PORT_METRICS=9090",
		"FOO_PORT=tcp://10.0.0.11:80",
		"FOO_PORT_80_TCP=tcp://10.0.0.11:80",
		"FOO_PORT_80_TCP_PROTO=tcp",
		"FOO_PORT_80_TCP_PORT=80",
		"FOO_PORT_80_TCP_ADDR=10.0.0.11",
		"FOO_PORT_9090_TCP=tcp://10.0.0.11:9090",
		"FOO_PORT_9090_TCP_PROTO=tcp",
		"FOO_PORT_9090_TCP_PORT=9090",
		"FOO_PORT_9090_TCP_ADDR=10.0.0.11",
		"FOO_PORT_443_SCTP=sctp://10.0.0.11:443",
		"FOO_PORT_443_SCTP_PROTO=sctp",
		"FOO_PORT_443_SCTP_PORT=443",
		"FOO_PORT_443_SCTP_ADDR=10.0.0.11",
	}, got)

	v6 := podenv.ServiceVars(svc("prod", "v6-svc", "fd00::1", port("", 80, "")))
	assert.Equal(t, [2]string{"V6_SVC_PORT", "tcp://[fd00::1]:80"}, v6[2])

	assert.Nil(t, podenv.ServiceVars(svc("prod", "h", corev1.ClusterIPNone, port("", 80, ""))))
	assert.Nil(t, podenv.ServiceVars(svc("prod", "noports", "10.0.0.1")))
	assert.Nil(t, podenv.ServiceVars(nil))
}

func ExampleBuilder_Env() {
	src := podenvtest.New(
		&corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kubernetes"},
			Spec:       corev1.ServiceSpec{ClusterIP: "10.96.0.1", Ports: []corev1.ServicePort{{Name: "https", Port: 443, Protocol: corev1.ProtocolTCP}}},
		},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "settings"}, Data: map[string]string{"LEVEL": "debug"}},
	)
	b, err := podenv.New(podenv.Config{Source: src})
	if err != nil {
		panic(err)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "cart-7d9f"},
		Spec: corev1.PodSpec{
			EnableServiceLinks: ptr.To(false),
			Containers: []corev1.Container{{
				Name: "cart",
				Env: []corev1.EnvVar{
					{Name: "POD", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"}}},
					{Name: "LOG_LEVEL", ValueFrom: &corev1.EnvVarSource{ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "settings"}, Key: "LEVEL"}}},
					{Name: "API", Value: "https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)"},
				},
			}},
		},
	}
	env, err := b.Env(context.Background(), pod, &pod.Spec.Containers[0], []string{"10.244.0.7"}, []string{"192.168.0.2"})
	if err != nil {
		panic(err)
	}
	for _, kv := range env[:3] {
		fmt.Printf("%s=%s\n", kv.Key, kv.Value)
	}
	fmt.Println(len(env), "variables")
	// Output:
	// POD=cart-7d9f
	// LOG_LEVEL=debug
	// API=https://10.96.0.1:443
	// 11 variables
}

func TestEnvFileKeyRef(t *testing.T) {
	vol := t.TempDir()
	outside := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(vol, "config.env"), []byte("TOKEN='s3cret'\nEMPTY=''\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(vol, "bad.env"), []byte("TOKEN=unquoted\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(outside, "config.env"), []byte("TOKEN='from outside'\n"), 0o644))
	require.NoError(t, os.Symlink(outside+"/config.env", filepath.Join(vol, "escape.env")))
	volumePath := func(pod *corev1.Pod, name string) (string, error) {
		if name != "env" {
			return "", errors.New("not set up")
		}
		return vol, nil
	}
	ref := func(volume, path, key string, optional bool) corev1.EnvVar {
		return corev1.EnvVar{Name: "V", ValueFrom: &corev1.EnvVarSource{FileKeyRef: &corev1.FileKeySelector{
			VolumeName: volume, Path: path, Key: key, Optional: ptr.To(optional)}}}
	}
	for _, tc := range []struct {
		name    string
		ev      corev1.EnvVar
		noPaths bool
		want    []string
		err     string
		is      error
	}{
		{name: "value", ev: ref("env", "config.env", "TOKEN", false), want: []string{"V=s3cret"}},
		// The absolute link is resolved inside the volume, where nothing is: the
		// file outside is never read.
		{name: "symlinks resolve inside the volume", ev: ref("env", "escape.env", "TOKEN", true), err: "couldn't parse env file", is: podenv.ErrInvalidFieldRef},
		{name: "dot-dot stays inside", ev: ref("env", "../../../../config.env", "TOKEN", false), want: []string{"V=s3cret"}},
		{name: "optional empty value", ev: ref("env", "config.env", "EMPTY", true), want: []string{}},
		{name: "empty value", ev: ref("env", "config.env", "EMPTY", false), err: `environment variable key "EMPTY" not found in file "` + vol + `/config.env"`, is: podenv.ErrMissingKey},
		{name: "missing key", ev: ref("env", "config.env", "NOPE", false), err: `environment variable key "NOPE" not found in file "` + vol + `/config.env"`, is: podenv.ErrMissingKey},
		{name: "bad file", ev: ref("env", "bad.env", "TOKEN", false), err: "couldn't parse env file", is: podenv.ErrInvalidFieldRef},
		{name: "missing file", ev: ref("env", "absent.env", "TOKEN", true), err: "couldn't parse env file", is: podenv.ErrInvalidFieldRef},
		{name: "unknown volume", ev: ref("other", "config.env", "TOKEN", false), err: `cannot find the volume "other" referenced by FileKeyRef: not set up`, is: podenv.ErrInvalidFieldRef},
		{name: "no VolumePath", ev: ref("env", "config.env", "TOKEN", false), noPaths: true, err: `cannot find the volume "env" referenced by FileKeyRef`, is: podenv.ErrInvalidFieldRef},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := podenv.Config{Source: podenvtest.New(), VolumePath: volumePath}
			if tc.noPaths {
				cfg.VolumePath = nil
			}
			b, err := podenv.New(cfg)
			require.NoError(t, err)
			pod := testPod("prod", false, corev1.Container{Env: []corev1.EnvVar{tc.ev}})
			got, err := b.Env(context.Background(), pod, &pod.Spec.Containers[0], nil, nil)
			if tc.err != "" {
				require.Error(t, err)
				assert.Equal(t, tc.err, err.Error())
				assert.ErrorIs(t, err, tc.is)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, append([]string{}, flat(got)...))
		})
	}
}
