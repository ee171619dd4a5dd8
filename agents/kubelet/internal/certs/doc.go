// Package certs gives the reference kubelet its credentials the way the upstream
// kubelet gets them when it joins a cluster (pkg/kubelet/certificate and
// pkg/kubelet/certificate/bootstrap upstream), on top of client-go's certificate
// manager (k8s.io/client-go/util/certificate) rather than hand-written CSR code.
//
// # TLS bootstrap
//
// When the kubeconfig at --kubeconfig is missing, cannot be read, or holds a client
// certificate that has expired, and a --bootstrap-kubeconfig is given, the kubelet
// uses the bootstrap credentials (usually a bootstrap token) to create a
// CertificateSigningRequest for signer kubernetes.io/kube-apiserver-client-kubelet,
// subject CN=system:node:NAME, O=system:nodes, usages digital signature and client
// auth (plus key encipherment for RSA keys). It waits for the CSR to be approved and
// signed, stores the pair in the certificate directory as
// kubelet-client-<timestamp>.pem with the kubelet-client-current.pem symlink, and
// writes --kubeconfig with the bootstrap kubeconfig's server and CA and that file as
// client certificate and key (cluster default-cluster, user default-auth, context
// default-context in namespace default), as upstream writes it.
//
// # Client certificate rotation
//
// With rotateCertificates, a client certificate manager requests the first
// certificate (with the bootstrap credentials, CSR name csr-XXXXX) and a new one at a
// jittered 70 to 90% of the current certificate's lifetime, with the current
// certificate. The API client's transport asks the manager for the certificate at
// every TLS handshake (client-go's transport.GetCertHolder) and, when the manager's
// certificate changes, closes every connection it dialled so that the next request
// handshakes again with the new certificate: no restart is needed. Like upstream, when
// no valid certificate has been available for five minutes while the API server
// answers, Run fails so the process can exit and bootstrap again.
//
// Without rotation the bootstrap happens once at start (CSR name node-csr-<digest>
// as upstream) and the certificate is used until the process restarts.
//
// # Serving certificate
//
// With serverTLSBootstrap, Serving requests the kubelet's serving certificate
// through a CSR for signer kubernetes.io/kubelet-serving, CN=system:node:NAME,
// O=system:nodes, with the node's hostname and IP addresses as subject alternative
// names, stored as kubelet-server-*.pem. Such CSRs are not approved automatically by
// kube-controller-manager; a cluster administrator (or an approver they run) must
// approve them. Serving.GetCertificate is a tls.Config.GetCertificate for the
// kubelet's HTTPS server.
//
// # Concurrency and cancellation
//
// NewClient blocks for the one-shot bootstrap until the certificate is issued or ctx
// ends. Client.Run and Serving.Run start the background managers and return, having
// stopped them, when their ctx ends. Every method is safe for concurrent use.
package certs
