package staticpod

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Every problem with one manifest file is a *ManifestError, which
// matches ErrInvalidManifest and the specific sentinel below through errors.Is.
var (
	// ErrInvalidManifest matches every per-file problem: the file is not run.
	ErrInvalidManifest = errors.New("invalid static pod manifest")
	// ErrSyntax: the file is not well-formed YAML or JSON.
	ErrSyntax = errors.New("malformed YAML or JSON")
	// ErrWrongKind: the document is not apiVersion v1, kind Pod (the kubelet's file
	// source reads neither PodLists nor any other kind).
	ErrWrongKind = errors.New("not a v1 Pod")
	// ErrMultipleDocuments: the file holds more than one YAML document.
	ErrMultipleDocuments = errors.New("more than one YAML document")
	// ErrUnknownField: a field that corev1.Pod does not have (often a typo).
	ErrUnknownField = errors.New("unknown field")
	// ErrFieldType: a value of the wrong type, such as a string where a number belongs.
	ErrFieldType = errors.New("wrong value type")
	// ErrInvalidPod: the pod fails validation (name missing, bad names, no containers...).
	ErrInvalidPod = errors.New("invalid pod")
	// ErrAPIReference: the pod references an API object (service account, secret,
	// config map, ...), which static pods may not do.
	ErrAPIReference = errors.New("static pods may not reference API objects")
	// ErrTooLarge: the file is 10 MiB or larger.
	ErrTooLarge = errors.New("manifest too large")
	// ErrUnreadable: the entry cannot be read as a regular file (FIFO, device, socket,
	// dangling symlink, symlink loop, I/O error).
	ErrUnreadable = errors.New("manifest unreadable")
	// ErrDuplicateName: another file, earlier in sorted order, already defines a pod with
	// the same namespace and name. The kubelet keeps the first one too.
	ErrDuplicateName = errors.New("duplicate pod name")

	// ErrInvalidConfig: New or NewReconciler was given an unusable configuration.
	ErrInvalidConfig = errors.New("invalid configuration")
	// ErrMirrorPod: creating, updating or deleting a mirror pod failed.
	ErrMirrorPod = errors.New("mirror pod")
)

// ManifestError describes why one manifest file was not loaded. Line and Column are
// 1-based and zero when the problem has no single position; Field is the JSON path
// of the offending field (such as spec.containers[0].image), empty when none applies.
type ManifestError struct {
	Path   string
	Line   int
	Column int
	Field  string
	// Kind is the specific sentinel (ErrSyntax, ErrUnknownField, ...).
	Kind error
	// Detail is the human-readable explanation.
	Detail string
}

func (e *ManifestError) Error() string {
	var b strings.Builder
	b.WriteString(e.Path)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
		if e.Column > 0 {
			fmt.Fprintf(&b, ":%d", e.Column)
		}
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		b.WriteString(": ")
	}
	b.WriteString(e.Detail)
	return b.String()
}

// Unwrap makes errors.Is match both ErrInvalidManifest and the specific Kind.
func (e *ManifestError) Unwrap() []error {
	if e.Kind == nil {
		return []error{ErrInvalidManifest}
	}
	return []error{ErrInvalidManifest, e.Kind}
}

func manifestErr(path string, kind error, format string, args ...any) *ManifestError {
	return &ManifestError{Path: path, Kind: kind, Detail: fmt.Sprintf(format, args...)}
}
