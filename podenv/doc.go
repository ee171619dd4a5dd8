// Package podenv computes a container's environment exactly as the kubelet does
// before it calls the CRI's CreateContainer: env and envFrom, the downward API
// (fieldRef, resourceFieldRef), configMap and secret references, $(VAR) expansion
// and the Docker-link style service variables.
//
// # What it does
//
// A Builder is made once per node with New(Config) and answers Env for any pod
// and container: the list of name/value pairs to put in the container's
// runtimeapi.ContainerConfig.Envs. ConfigMaps, Secrets and Services are read
// through Source, a three-method interface the caller implements (from informer
// caches, a clientset, or podenvtest.Source in unit tests).
//
// # Semantics matched upstream
//
// The rules are those of pkg/kubelet/kubelet_pods.go (makeEnvironmentVariables,
// getServiceEnvVarMap, podFieldSelectorRuntimeValue), pkg/kubelet/envvars and
// third_party/forked/golang/expansion in Kubernetes v1.37.2:
//
//   - envFrom entries are read first, in order, each key getting the entry's
//     prefix; a later entry overwrites an earlier one. Then env entries are
//     resolved in order and overwrite envFrom values of the same name.
//   - A literal value is $(VAR)-expanded against the variables defined so far
//     (envFrom values and earlier env entries) and the service variables.
//     $$ is a literal $, an unknown $(VAR) stays as written, a $ not followed by
//     ( is kept as is.
//   - fieldRef accepts apiVersion v1 and metadata.name, metadata.namespace,
//     metadata.uid, metadata.labels, metadata.annotations,
//     metadata.labels['k'], metadata.annotations['k'], spec.nodeName,
//     spec.serviceAccountName, status.hostIP, status.hostIPs, status.podIP,
//     status.podIPs.
//   - resourceFieldRef reads the container's requests and limits; a limit that
//     is not set defaults to the node's allocatable (Config.NodeAllocatable), as
//     the kubelet's defaultPodLimitsForDownwardAPI does. CPU rounds up to the
//     divisor, memory and ephemeral storage too.
//   - fileKeyRef (EnvFiles) reads KEY='value' lines from a file in one of the
//     pod's volumes, found through Config.VolumePath.
//   - A missing configMap or secret is an error (`configmap "x" not found`)
//     unless the reference is optional; a missing key is an error
//     (`couldn't find key k in ConfigMap ns/x`) unless optional, in which case
//     the variable is left out.
//   - Service variables: every Service with a cluster IP in the pod's namespace
//     when enableServiceLinks is true (the default), and the `kubernetes` service
//     of the default namespace always. For a service `foo` with port 80/TCP named
//     http: FOO_SERVICE_HOST, FOO_SERVICE_PORT, FOO_SERVICE_PORT_HTTP, FOO_PORT,
//     FOO_PORT_80_TCP, FOO_PORT_80_TCP_PROTO, FOO_PORT_80_TCP_PORT,
//     FOO_PORT_80_TCP_ADDR. A variable the container defines itself wins over a
//     service variable of the same name.
//
// # Order
//
// The kubelet builds the list from Go maps, so its order is random from one
// container start to the next. Env returns the same set of variables in a stable
// order instead: envFrom variables that no env entry redefines, in the order they
// were first defined (keys of one configMap or secret sorted), then env entries in
// declaration order, then the service variables sorted by name.
//
// # Concurrency and cancellation
//
// A Builder is safe for concurrent use. ctx is passed to every Source call; when it
// ends, Env returns the Source's error.
package podenv
