package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/nodekit-dev/nodekit/cri"
)

// writeCRILog appends CRI-format lines ("<RFC3339Nano> <stream> F <text>") to path.
func writeCRILog(t *testing.T, path string, at time.Time, lines ...string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	require.NoError(t, err)
	defer f.Close()
	for i, l := range lines {
		stream := "stdout"
		if strings.HasPrefix(l, "err:") {
			stream = "stderr"
		}
		_, err := fmt.Fprintf(f, "%s %s F %s\n", at.Add(time.Duration(i)*time.Second).UTC().Format(time.RFC3339Nano), stream, l)
		require.NoError(t, err)
	}
}

func logFile(f *serverFixture, pod *corev1.Pod, container string, restart int) string {
	return filepath.Join(cri.PodLogsDirectory(f.logsDir, pod), cri.ContainerLogPath(container, restart))
}

func TestParseLogOptions(t *testing.T) {
	for _, tc := range []struct {
		query string
		want  corev1.PodLogOptions
		bad   bool
	}{
		{"", corev1.PodLogOptions{}, false},
		{"follow=true&previous=1&timestamps=yes", corev1.PodLogOptions{Follow: true, Previous: true, Timestamps: true}, false},
		{"follow=false&previous=0&timestamps=FALSE", corev1.PodLogOptions{}, false},
		{"timestamps=f", corev1.PodLogOptions{Timestamps: true}, false},
		{"tailLines=10", corev1.PodLogOptions{TailLines: ptr.To[int64](10)}, false},
		{"tail=5", corev1.PodLogOptions{TailLines: ptr.To[int64](5)}, false},
		{"tail=all&tailLines=3", corev1.PodLogOptions{}, false},
		{"limitBytes=100&sinceSeconds=60", corev1.PodLogOptions{LimitBytes: ptr.To[int64](100), SinceSeconds: ptr.To[int64](60)}, false},
		{"sinceTime=2026-12-03T06:00:00Z", corev1.PodLogOptions{SinceTime: &metav1.Time{Time: time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC)}}, false},
		{"container=main&stream=All", corev1.PodLogOptions{Container: "main", Stream: ptr.To("All")}, false},
		{"tailLines=ten", corev1.PodLogOptions{}, true},
		{"limitBytes=1.5", corev1.PodLogOptions{}, true},
		{"sinceTime=yesterday", corev1.PodLogOptions{}, true},
	} {
		t.Run(tc.query, func(t *testing.T) {
			q, err := url.ParseQuery(tc.query)
			require.NoError(t, err)
			got, err := parseLogOptions(q)
			if tc.bad {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			if tc.want.SinceTime != nil {
				require.NotNil(t, got.SinceTime)
				assert.True(t, tc.want.SinceTime.Equal(got.SinceTime))
				got.SinceTime, tc.want.SinceTime = nil, nil
			}
			assert.Equal(t, tc.want, *got)
		})
	}
}

func TestServerContainerLogs(t *testing.T) {
	f := newServerFixture(t, nil)
	pod, _ := f.runPod("web", false, "main")
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	writeCRILog(t, logFile(f, pod, "main", 0), base, "one", "err:two", "three", "four")

	logs := func(query string) (int, string) {
		return f.do("GET", "/containerLogs/default/web/main"+query, "admin")
	}
	t.Run("all lines, stdout and stderr", func(t *testing.T) {
		code, body := logs("")
		require.Equal(t, http.StatusOK, code, body)
		assert.Equal(t, "one\nerr:two\nthree\nfour\n", body)
	})
	t.Run("tailLines and tail", func(t *testing.T) {
		_, body := logs("?tailLines=2")
		assert.Equal(t, "three\nfour\n", body)
		_, body = logs("?tail=1")
		assert.Equal(t, "four\n", body)
		_, body = logs("?tail=all")
		assert.Equal(t, "one\nerr:two\nthree\nfour\n", body)
		_, body = logs("?tailLines=0")
		assert.Empty(t, body)
	})
	t.Run("timestamps", func(t *testing.T) {
		_, body := logs("?timestamps=true&tailLines=1")
		assert.Equal(t, base.Add(3*time.Second).UTC().Format("2006-01-02T15:04:05.000000000Z07:00")+" four\n", body)
	})
	t.Run("limitBytes", func(t *testing.T) {
		_, body := logs("?limitBytes=6")
		assert.Equal(t, "one\ner", body)
	})
	t.Run("sinceTime and sinceSeconds", func(t *testing.T) {
		_, body := logs("?sinceTime=" + url.QueryEscape(base.Add(2*time.Second).UTC().Format(time.RFC3339)))
		assert.Equal(t, "three\nfour\n", body)
		_, body = logs("?sinceSeconds=60")
		assert.Empty(t, body, "every line is an hour old")
	})
	t.Run("bad input", func(t *testing.T) {
		for _, tc := range []struct {
			query string
			code  int
			body  string
		}{
			{"?tailLines=ten", 400, `{"message": "Unable to decode query."}`},
			{"?sinceTime=yesterday", 400, `{"message": "Unable to decode query."}`},
			{"?tailLines=-1", 422, `{"message": "Invalid request."}`},
			{"?limitBytes=0", 422, `{"message": "Invalid request."}`},
			{"?sinceSeconds=0", 422, `{"message": "Invalid request."}`},
			{"?sinceSeconds=5&sinceTime=2026-01-01T00:00:00Z", 422, `{"message": "Invalid request."}`},
			{"?stream=Bogus", 422, `{"message": "Invalid request."}`},
			{"?stream=Stdout", 400, `unable to return the given log stream: "Stdout". Please enable PodLogsQuerySplitStreams feature gate in kubelet`},
			{"?previous=true", 400, `previous terminated container "main" in pod "web" not found`},
		} {
			code, body := logs(tc.query)
			assert.Equal(t, tc.code, code, tc.query)
			assert.Equal(t, tc.body, body, tc.query)
		}
		code, body := f.do("GET", "/containerLogs/default/nope/main", "admin")
		assert.Equal(t, http.StatusNotFound, code)
		assert.Equal(t, `pod "nope" does not exist`, body)
		code, body = f.do("GET", "/containerLogs/default/web/sidecar", "admin")
		assert.Equal(t, http.StatusNotFound, code)
		assert.Equal(t, `container "sidecar" not found in pod "web"`, body)
		code, body = f.do("GET", "/containerLogs/kube-system/web/main", "admin")
		assert.Equal(t, http.StatusNotFound, code, "the namespace is part of the pod's name")
		assert.Equal(t, `pod "web" does not exist`, body)
		code, _ = f.do("POST", "/containerLogs/default/web/main", "admin")
		assert.Equal(t, http.StatusMethodNotAllowed, code)
	})
}

func TestServerContainerLogsPreviousAndStates(t *testing.T) {
	f := newServerFixture(t, nil)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "crash", Namespace: "default", UID: "uid-crash"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox:latest"}, {Name: "pull", Image: "busybox:latest"}}}}
	ctx := context.Background()
	sbCfg, err := cri.PodSandboxConfig(pod, cri.PodOptions{LogsDir: f.logsDir})
	require.NoError(t, err)
	sb, err := f.client.RunPodSandbox(ctx, sbCfg, "")
	require.NoError(t, err)
	old := f.startContainer(pod, sb, sbCfg, "main", 0)
	require.NoError(t, f.client.StopContainer(ctx, old, 0))
	cur := f.startContainer(pod, sb, sbCfg, "main", 1)
	writeCRILog(t, logFile(f, pod, "main", 0), time.Now(), "first run", "crashed")
	writeCRILog(t, logFile(f, pod, "main", 1), time.Now(), "second run")
	st := &corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{
		{Name: "main", ContainerID: "fakeruntime://" + cur, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, ContainerID: "fakeruntime://" + old}}},
		{Name: "pull", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff"}}},
	}}
	f.pods.add(pod, st, false)

	code, body := f.do("GET", "/containerLogs/default/crash/main", "admin")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "second run\n", body)
	code, body = f.do("GET", "/containerLogs/default/crash/main?previous=true", "admin")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "first run\ncrashed\n", body, "the previous container's own log file")
	code, body = f.do("GET", "/containerLogs/default/crash/pull", "admin")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Equal(t, `container "pull" in pod "crash" is waiting to start: trying and failing to pull image`, body)

	for _, tc := range []struct {
		cs   corev1.ContainerStatus
		want string
	}{
		{corev1.ContainerStatus{Name: "main", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImagePull"}}},
			`container "main" in pod "crash" is waiting to start: image can't be pulled`},
		{corev1.ContainerStatus{Name: "main", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}},
			`container "main" in pod "crash" is waiting to start: ContainerCreating`},
		{corev1.ContainerStatus{Name: "main"}, `container "main" in pod "crash" is waiting to start - no logs yet`},
		{corev1.ContainerStatus{Name: "main", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{}}},
			`container "main" in pod "crash" is terminated`},
		{corev1.ContainerStatus{Name: "other"}, `container "main" in pod "crash" is not available`},
	} {
		_, err := logContainerID("crash", &corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{tc.cs}}, "main", false)
		assert.EqualError(t, err, tc.want)
	}
	// A terminated container whose successor never started: its predecessor's logs.
	id, err := logContainerID("crash", &corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "main",
		State:                corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{}},
		LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ContainerID: "containerd://abc"}}}}}, "main", false)
	require.NoError(t, err)
	assert.Equal(t, "abc", id)
}

func TestServerContainerLogsFollow(t *testing.T) {
	f := newServerFixture(t, nil)
	pod, st := f.runPod("tail", false, "main")
	path := logFile(f, pod, "main", 0)
	writeCRILog(t, path, time.Now(), "before")

	req, err := http.NewRequest("GET", f.http.URL+"/containerLogs/default/tail/main?follow=true", nil)
	require.NoError(t, err)
	req.Header.Set("X-Test-User", "admin")
	resp, err := f.http.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	r := bufio.NewReader(resp.Body)
	line, err := r.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "before\n", line)

	writeCRILog(t, path, time.Now(), "after")
	line, err = r.ReadString('\n')
	require.NoError(t, err)
	assert.Equal(t, "after\n", line, "a line written while following arrives")

	// The container exits: the stream ends.
	id := strings.TrimPrefix(st.ContainerStatuses[0].ContainerID, "fakeruntime://")
	require.NoError(t, f.client.StopContainer(context.Background(), id, 0))
	done := make(chan error, 1)
	go func() { _, err := io.ReadAll(r); done <- err }()
	select {
	case err := <-done:
		assert.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the followed log did not end after the container exited")
	}
}
