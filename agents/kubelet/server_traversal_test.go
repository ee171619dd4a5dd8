package main

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodekit-dev/nodekit/cri"
)

// TestServerContainerLogsTraversal sends containerLogs requests whose names try to
// leave the pod's log folder (literal and escaped "..", escaped slashes, names that
// are not DNS labels) and checks each gets the kubelet's answer: a redirect to the
// cleaned path for a literal "..", as Go's ServeMux in front of the kubelet's router;
// go-restful's 404 for an escaped slash; 404 naming the pod or container otherwise.
// Canary files where a traversal would land never appear in any answer.
func TestServerContainerLogsTraversal(t *testing.T) {
	f := newServerFixture(t, nil)
	pod, _ := f.runPod("web", false, "main")
	writeCRILog(t, logFile(f, pod, "main", 0), time.Now(), "the web log")

	const canary = "CANARY-must-never-be-served"
	podDir := cri.PodLogsDirectory(f.logsDir, pod)
	for _, p := range []string{
		filepath.Join(filepath.Dir(f.logsDir), "canary"), // next to the logs folder
		filepath.Join(f.logsDir, "canary"),               // in the logs folder
		filepath.Join(podDir, "main", "canary"),          // beside the container's log
		filepath.Join(podDir, "canary", "0.log"),         // what a container named "canary" would read
	} {
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(canary+"\n"), 0o644))
	}

	noRedirect := &http.Client{Timeout: 5 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
	send := func(client *http.Client, rawPath string) (int, string, string) {
		t.Helper()
		req, err := http.NewRequest("GET", f.http.URL+"/", nil)
		require.NoError(t, err)
		// Sent as written: no client-side cleaning or re-escaping.
		req.URL.Opaque = rawPath
		req.Header.Set("X-Test-User", "admin")
		resp, err := client.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, resp.Header.Get("Location"), string(b)
	}

	tried := 0
	check := func(path string, code int, location, body string) {
		t.Helper()
		tried++
		gotCode, gotLocation, gotBody := send(noRedirect, path)
		assert.Equal(t, code, gotCode, path)
		assert.Equal(t, location, gotLocation, path)
		if body != "" || code != http.StatusTemporaryRedirect {
			assert.Equal(t, body, gotBody, path)
		}
		// Following the redirect as the client would: still nothing outside.
		_, _, followed := send(&http.Client{Timeout: 5 * time.Second}, path)
		for _, b := range []string{gotBody, followed} {
			assert.NotContains(t, b, "CANARY", path)
			assert.NotContains(t, b, "root:", path)
		}
	}

	// A literal ".." is cleaned by the ServeMux before any route: 307 to the clean path
	// (and that path is a 404).
	check("/containerLogs/default/web/../../../../etc/passwd", http.StatusTemporaryRedirect, "/etc/passwd", "")
	check("/containerLogs/default/web/../../../../canary", http.StatusTemporaryRedirect, "/canary", "")
	check("/containerLogs/default/web/..", http.StatusTemporaryRedirect, "/containerLogs/default", "")
	check("/containerLogs/default/../web/main", http.StatusTemporaryRedirect, "/containerLogs/web/main", "")
	check("/containerLogs/default/web/main/../canary", http.StatusTemporaryRedirect, "/containerLogs/default/web/canary", "")
	code, body := f.do("GET", "/etc/passwd", "admin")
	assert.Equal(t, http.StatusNotFound, code)
	assert.Equal(t, "404 page not found\n", body)

	// Escaped slashes make more segments than the route has: go-restful's 404.
	for _, p := range []string{
		"/containerLogs/default/web/%2e%2e%2f%2e%2e%2f%2e%2e%2f%2e%2e%2fetc%2fpasswd",
		"/containerLogs/default/web/..%2f..%2fcanary",
		"/containerLogs/default/web/main%2f..%2fcanary",
		"/containerLogs/default/web%2fmain/main",
		"/containerLogs/default/web/main/extra",
		"/containerLogs/default/web",
	} {
		check(p, http.StatusNotFound, "", "404: Page Not Found")
	}

	// Escaped dots and names that are not DNS labels are names like any other: not
	// a container (or pod) of this node.
	for _, tc := range []struct{ path, body string }{
		{"/containerLogs/default/web/%2e%2e", `container ".." not found in pod "web"`},
		{"/containerLogs/default/web/.%2e", `container ".." not found in pod "web"`},
		{"/containerLogs/default/web/canary", `container "canary" not found in pod "web"`},
		{"/containerLogs/default/web/Main_Container", `container "Main_Container" not found in pod "web"`},
		{"/containerLogs/default/web/main%20x", `container "main x" not found in pod "web"`},
		{"/containerLogs/default/web/main%00", `container "main\x00" not found in pod "web"`},
		{"/containerLogs/default/%2e%2e/main", `pod ".." does not exist`},
		{"/containerLogs/%2e%2e/web/main", `pod "web" does not exist`},
		{"/containerLogs/default/WEB/main", `pod "WEB" does not exist`},
		{"/containerLogs/default/" + strings.Repeat("w", 300) + "/main", `pod "` + strings.Repeat("w", 300) + `" does not exist`},
	} {
		check(tc.path, http.StatusNotFound, "", tc.body)
	}

	// The pod's own log is still served.
	code, body = f.do("GET", "/containerLogs/default/web/main", "admin")
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, "the web log\n", body)
	t.Logf("%d traversal and bad-name requests, none served a canary", tried)
}
