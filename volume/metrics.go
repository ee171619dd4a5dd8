package volume

import "time"

// Metrics receives one call per volume operation, so an agent can export the
// kubelet's storage_operation_duration_seconds histogram (labels volume_plugin,
// operation_name, status, migrated="false"). Implementations must be safe for
// concurrent use. The default does nothing.
type Metrics interface {
	// VolumeOperation reports one operation: plugin is the kubelet's plugin name
	// ("kubernetes.io/configmap"), operation "volume_mount" (Setup of one volume,
	// also a refresh) or "volume_unmount" (Teardown of one mount), err its result
	// (the kubelet's status label is "success" for nil, else "fail-unknown").
	VolumeOperation(plugin, operation string, d time.Duration, err error)
}

type noMetrics struct{}

func (noMetrics) VolumeOperation(string, string, time.Duration, error) {}

// pluginName is the kubelet's plugin name of a volume folder
// ("kubernetes.io~configmap" -> "kubernetes.io/configmap").
func pluginName(folder string) string {
	b := []byte(folder)
	for i, c := range b {
		if c == '~' {
			b[i] = '/'
		}
	}
	return string(b)
}
