package containerd

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/nodekit-dev/nodekit/internal/testenv"
)

// TestRegistryRetriesWhenItsPortIsTaken hands the registry's first attempt a port on
// which another registry already answers /v2/ (as another test's would after both
// chose the port): the harness must notice the answer is not its registry's, start
// again on a fresh port, say so, and push the image to its own registry.
func TestRegistryRetriesWhenItsPortIsTaken(t *testing.T) {
	testenv.RequireLong(t)
	testenv.LookPath(t, "docker-registry")
	testenv.LookPath(t, "skopeo")
	foreign := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "{}")
	}))
	defer foreign.Close()
	taken := foreign.Listener.Addr().(*net.TCPAddr).Port

	var mu sync.Mutex
	var handedOut []int
	c := &Containerd{dir: t.TempDir(), images: loadImages(t), opts: Options{Registry: true, pickPorts: func(n int) ([]int, error) {
		ports, err := testenv.FreePorts(n)
		if err != nil {
			return nil, err
		}
		mu.Lock()
		defer mu.Unlock()
		if len(handedOut) == 0 {
			ports[0] = taken
		}
		handedOut = append(handedOut, ports[0])
		return ports, nil
	}}}
	rec := &testenv.LogRecorder{T: t}
	err := c.startRegistry(rec)
	if c.registry != nil {
		defer c.registry.Stop(5 * time.Second)
	}
	require.NoError(t, err)

	mu.Lock()
	assert.Len(t, handedOut, 2, "one retry on a fresh port")
	mu.Unlock()
	assert.NotEqual(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(taken)), c.RegistryHost())
	retries := rec.Matching("lost its port")
	require.Len(t, retries, 1, "the retry is logged with its reason")
	assert.Contains(t, retries[0], testenv.ErrPortTaken.Error())
	// skopeo pushed to our registry, which now lists the image's tag.
	resp, err := http.Get("http://" + c.RegistryHost() + "/v2/nodekit/busybox/tags/list")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
	assert.Contains(t, string(body), `"1.35.0"`)
}
