package podsync

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Skeleton bodies: filled in by the following commits.

func podStatus(pod *corev1.Pod, view *PodView, in StatusInput) corev1.PodStatus {
	return corev1.PodStatus{}
}

func (s *Syncer) syncPod(ctx context.Context, pod *corev1.Pod, view *PodView) *SyncResult {
	return &SyncResult{Err: errors.New("podsync: SyncPod not implemented yet")}
}

func (s *Syncer) killPod(ctx context.Context, pod *corev1.Pod, view *PodView, grace *int64) *SyncResult {
	return &SyncResult{Err: errors.New("podsync: KillPod not implemented yet")}
}

func (s *Syncer) removePod(ctx context.Context, uid types.UID) error {
	return errors.New("podsync: RemovePod not implemented yet")
}

// FileReader reads files on the node: termination message files and container
// logs. os.ReadFile-like; nil in LoadView skips termination messages.
type FileReader interface {
	ReadFile(path string) ([]byte, error)
}

// TerminationMessage returns the termination message of an exited container as
// the kubelet finds it: the file mounted at its terminationMessagePath (at most
// 4096 bytes), or, with policy FallbackToLogsOnError and a non-zero exit code and
// no file content, the tail of its log (last 80 lines, at most 2048 bytes).
func TerminationMessage(c *runtimeapi.ContainerStatus, files FileReader) string { return "" }

// isNotFound reports whether err is a NotFound from the runtime: a gRPC status
// NotFound anywhere in its chain.
func isNotFound(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if st, ok := status.FromError(e); ok && st.Code() == codes.NotFound {
			return true
		}
	}
	return false
}
