package probe

import "k8s.io/apimachinery/pkg/types"

// SetTestHooks replaces the random source of the first delay and installs a
// callback run after every probe round of every worker. Call before Run.
func (m *Manager) SetTestHooks(rnd func() float64, probed func(podUID types.UID, container string, t Type)) {
	if rnd != nil {
		m.rand = rnd
	}
	if probed != nil {
		m.probed = func(k workerKey) { probed(k.podUID, k.container, k.typ) }
	}
}
