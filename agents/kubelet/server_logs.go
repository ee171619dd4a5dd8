package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/util/flushwriter"
	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/logs"

	"github.com/nodekit-dev/nodekit/cri"
)

// getContainerLogs serves GET /containerLogs/{namespace}/{pod}/{container}, what
// kubectl logs reaches through the API server: the container's CRI log file read
// with cri-client's logs package, with the kubelet's query parameters (follow,
// previous, timestamps, tailLines or tail, sinceSeconds, sinceTime, limitBytes),
// checks and answers (pkg/kubelet/server getContainerLogs and
// Kubelet.GetKubeletContainerLogs).
func (s *kubeletServer) getContainerLogs(w http.ResponseWriter, r *http.Request) {
	namespace, podName, container := r.PathValue("namespace"), r.PathValue("pod"), r.PathValue("container")
	if strings.Contains(namespace+podName+container, "/") {
		// An escaped slash (%2F) inside a segment: the kubelet's router splits the
		// decoded path, so the request has too many segments for its route.
		pageNotFound(w, r)
		return
	}
	switch {
	case podName == "":
		writeErrorString(w, http.StatusBadRequest, `{"message": "Missing podID."}`)
		return
	case container == "":
		writeErrorString(w, http.StatusBadRequest, `{"message": "Missing container name."}`)
		return
	case namespace == "":
		writeErrorString(w, http.StatusBadRequest, `{"message": "Missing podNamespace."}`)
		return
	}
	opts, err := parseLogOptions(r.URL.Query())
	if err != nil {
		writeErrorString(w, http.StatusBadRequest, `{"message": "Unable to decode query."}`)
		return
	}
	if err := validateLogOptions(opts); err != nil {
		writeErrorString(w, http.StatusUnprocessableEntity, `{"message": "Invalid request."}`)
		return
	}
	pod, status, ok := s.cfg.Pods.serverPod(namespace, podName)
	if !ok {
		writeErrorString(w, http.StatusNotFound, fmt.Sprintf("pod %q does not exist", podName))
		return
	}
	if containerSpec(pod, container) == nil {
		writeErrorString(w, http.StatusNotFound, fmt.Sprintf("container %q not found in pod %q", container, podName))
		return
	}
	if opts.Stream != nil && *opts.Stream != corev1.LogStreamAll {
		// PodLogsQuerySplitStreams is alpha and off in v1.37.
		writeErrorString(w, http.StatusBadRequest, fmt.Sprintf("unable to return the given log stream: %q. Please enable PodLogsQuerySplitStreams feature gate in kubelet", *opts.Stream))
		return
	}
	if status == nil {
		// Not synced yet (a restarted kubelet): the status the API server has.
		status = &pod.Status
	}
	id, err := logContainerID(pod.Name, status, container, opts.Previous)
	if err != nil {
		writeErrorString(w, http.StatusBadRequest, err.Error())
		return
	}
	fw := flushwriter.Wrap(w)
	w.Header().Set("Transfer-Encoding", "chunked")
	// A zero-byte write before handing over to the log reader, as the kubelet.
	if _, err := fw.Write(nil); err != nil {
		return
	}
	if err := readContainerLogs(r.Context(), s.cfg.Runtime, id, opts, fw); err != nil {
		writeErrorString(w, http.StatusBadRequest, err.Error())
	}
}

// pageNotFound is go-restful's answer, in the kubelet, to a path none of its routes
// matches.
func pageNotFound(w http.ResponseWriter, _ *http.Request) {
	writeErrorString(w, http.StatusNotFound, "404: Page Not Found")
}

// parseLogOptions decodes the query as the kubelet does (v1 PodLogOptions from URL
// values, with "tail" accepted for tailLines and tail=all meaning no limit): a
// boolean is false only for "0" or "false" (any case), numbers are integers and
// sinceTime is RFC 3339.
func parseLogOptions(query url.Values) (*corev1.PodLogOptions, error) {
	q := url.Values{}
	for k, v := range query {
		q[k] = v
	}
	if tail := q.Get("tail"); tail != "" {
		q["tailLines"] = []string{tail}
		if tail == "all" {
			delete(q, "tailLines")
		}
	}
	o := &corev1.PodLogOptions{}
	var errs []error
	boolean := func(name string, out *bool) {
		if v, ok := q[name]; ok && len(v) > 0 {
			errs = append(errs, runtime.Convert_Slice_string_To_bool(&v, out, nil))
		}
	}
	integer := func(name string, out **int64) {
		if v, ok := q[name]; ok && len(v) > 0 {
			errs = append(errs, runtime.Convert_Slice_string_To_Pointer_int64(&v, out, nil))
		}
	}
	if v, ok := q["container"]; ok && len(v) > 0 {
		o.Container = v[0]
	}
	boolean("follow", &o.Follow)
	boolean("previous", &o.Previous)
	boolean("timestamps", &o.Timestamps)
	boolean("insecureSkipTLSVerifyBackend", &o.InsecureSkipTLSVerifyBackend)
	integer("sinceSeconds", &o.SinceSeconds)
	integer("tailLines", &o.TailLines)
	integer("limitBytes", &o.LimitBytes)
	if v, ok := q["sinceTime"]; ok && len(v) > 0 {
		errs = append(errs, metav1.Convert_Slice_string_To_Pointer_v1_Time(&v, &o.SinceTime, nil))
	}
	if v, ok := q["stream"]; ok && len(v) > 0 {
		stream := v[0]
		o.Stream = &stream
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return o, nil
}

// validateLogOptions is ValidatePodLogOptions (pkg/apis/core/v1/validation).
func validateLogOptions(o *corev1.PodLogOptions) error {
	var errs []error
	if o.TailLines != nil && *o.TailLines < 0 {
		errs = append(errs, fmt.Errorf("tailLines: Invalid value: %d: must be greater than or equal to 0", *o.TailLines))
	}
	if o.LimitBytes != nil && *o.LimitBytes < 1 {
		errs = append(errs, fmt.Errorf("limitBytes: Invalid value: %d: must be greater than 0", *o.LimitBytes))
	}
	switch {
	case o.SinceSeconds != nil && o.SinceTime != nil:
		errs = append(errs, errors.New("at most one of `sinceTime` or `sinceSeconds` may be specified"))
	case o.SinceSeconds != nil && *o.SinceSeconds < 1:
		errs = append(errs, fmt.Errorf("sinceSeconds: Invalid value: %d: must be greater than 0", *o.SinceSeconds))
	}
	if o.Stream != nil {
		switch *o.Stream {
		case corev1.LogStreamStdout, corev1.LogStreamStderr, corev1.LogStreamAll:
		default:
			errs = append(errs, fmt.Errorf("stream: Unsupported value: %q", *o.Stream))
		}
		if *o.Stream != corev1.LogStreamAll && o.TailLines != nil {
			errs = append(errs, errors.New("`tailLines` and specific `stream` are mutually exclusive for now"))
		}
	}
	return errors.Join(errs...)
}

// containerSpec finds a container of the pod by name: app, init or ephemeral.
func containerSpec(pod *corev1.Pod, name string) *corev1.Container {
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i]
		}
	}
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == name {
			return &pod.Spec.InitContainers[i]
		}
	}
	for i := range pod.Spec.EphemeralContainers {
		if pod.Spec.EphemeralContainers[i].Name == name {
			c := corev1.Container(pod.Spec.EphemeralContainers[i].EphemeralContainerCommon)
			return &c
		}
	}
	return nil
}

// logContainerID picks the runtime container whose log is asked for, from the pod's
// status, as the kubelet's validateContainerLogStatus: the previous terminated one
// with previous, else the running one, else the terminated one (or the one before it
// when the next never started), with the kubelet's messages when there is none. It
// returns the bare runtime ID.
func logContainerID(podName string, status *corev1.PodStatus, container string, previous bool) (string, error) {
	var cs *corev1.ContainerStatus
	for _, list := range [][]corev1.ContainerStatus{status.ContainerStatuses, status.InitContainerStatuses, status.EphemeralContainerStatuses} {
		for i := range list {
			if list[i].Name == container {
				cs = &list[i]
				break
			}
		}
		if cs != nil {
			break
		}
	}
	if cs == nil {
		return "", fmt.Errorf("container %q in pod %q is not available", container, podName)
	}
	last := cs.LastTerminationState
	waiting, running, terminated := cs.State.Waiting, cs.State.Running, cs.State.Terminated
	var id string
	switch {
	case previous:
		if last.Terminated == nil || last.Terminated.ContainerID == "" {
			return "", fmt.Errorf("previous terminated container %q in pod %q not found", container, podName)
		}
		id = last.Terminated.ContainerID
	case running != nil:
		id = cs.ContainerID
	case terminated != nil:
		if terminated.ContainerID != "" {
			id = terminated.ContainerID
		} else if last.Terminated != nil && last.Terminated.ContainerID != "" {
			id = last.Terminated.ContainerID
		} else {
			return "", fmt.Errorf("container %q in pod %q is terminated", container, podName)
		}
	case last.Terminated != nil:
		if last.Terminated.ContainerID == "" {
			return "", fmt.Errorf("container %q in pod %q is terminated", container, podName)
		}
		id = last.Terminated.ContainerID
	case waiting != nil:
		switch waiting.Reason {
		case "ErrImagePull":
			return "", fmt.Errorf("container %q in pod %q is waiting to start: image can't be pulled", container, podName)
		case "ImagePullBackOff":
			return "", fmt.Errorf("container %q in pod %q is waiting to start: trying and failing to pull image", container, podName)
		default:
			return "", fmt.Errorf("container %q in pod %q is waiting to start: %v", container, podName, waiting.Reason)
		}
	default:
		return "", fmt.Errorf("container %q in pod %q is waiting to start - no logs yet", container, podName)
	}
	if _, bare, ok := strings.Cut(id, "://"); ok {
		id = bare
	}
	return id, nil
}

// readContainerLogs reads a container's log file, found through the runtime's
// ContainerStatus (the path the sandbox's log directory and the container's
// <name>/<restartCount>.log make), into out, as kuberuntime's ReadLogs.
func readContainerLogs(ctx context.Context, rt *cri.Client, id string, o *corev1.PodLogOptions, out io.Writer) error {
	st, err := rt.ContainerStatus(ctx, id)
	if err != nil {
		return fmt.Errorf("unable to retrieve container logs for %s://%s", rt.RuntimeVersion().GetRuntimeName(), id)
	}
	now := time.Now()
	lo := &logs.LogOptions{TailLines: o.TailLines, LimitBytes: o.LimitBytes, Follow: o.Follow, Timestamp: o.Timestamps}
	if o.SinceSeconds != nil {
		lo.Since = now.Add(-time.Duration(*o.SinceSeconds) * time.Second)
	}
	if o.SinceTime != nil && o.SinceTime.After(lo.Since) {
		lo.Since = o.SinceTime.Time
	}
	return logs.ReadLogs(ctx, st.GetLogPath(), id, lo, logRuntime{rt: rt}, out, out)
}

// logRuntime gives cri-client's log reader the one runtime call it makes, to learn
// whether a followed container still runs.
type logRuntime struct {
	internalapi.RuntimeService
	rt *cri.Client
}

func (l logRuntime) ContainerStatus(ctx context.Context, id string, verbose bool) (*runtimeapi.ContainerStatusResponse, error) {
	return l.rt.RuntimeService().ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: id, Verbose: verbose})
}
