// Command forkd-controller runs forkd's Kubernetes controller: it finds the
// forkd daemons (the pods of the node DaemonSet), polls them into its view
// of the nodes, forks Sandboxes on them and binds SandboxClaims
// (docs/KUBERNETES.md). deploy/ runs it as a Deployment.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/forkd-dev/forkd/k8s/controller"
	"github.com/forkd-dev/forkd/k8s/gateway"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "forkd-controller:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		namespace    = flag.String("namespace", os.Getenv("POD_NAMESPACE"), "namespace of the forkd node DaemonSet's pods (env POD_NAMESPACE)")
		selector     = flag.String("daemon-selector", "app.kubernetes.io/name=forkd-node", "label selector of the forkd daemon pods")
		port         = flag.Int("daemon-port", 7070, "port of the daemons' API (forkd serve --listen)")
		scheme       = flag.String("daemon-scheme", "https", "https, or http for daemons run with --insecure-no-tls-or-auth-i-know")
		tokenFile    = flag.String("token-file", "/etc/forkd/token/token", "file holding the bearer token the daemons accept")
		caFile       = flag.String("ca-file", "", "PEM CA certificate(s) the daemons' TLS certificates chain to (empty: system roots)")
		serverName   = flag.String("server-name", "forkd-node", "name the daemons' certificate is checked against (pod IPs change; the certificate names this)")
		pollInterval = flag.Duration("poll-interval", 10*time.Second, "time between polls of every daemon")
		threshold    = flag.Int("failure-threshold", 6, "polls failed in a row (or rounds without the daemon pod) that make a node lost")
		memoryShare  = flag.Float64("memory-share", 1, "part of a node's allocatable memory placement may reserve for sandboxes (above 1 overcommits; forks share pages)")
		defMemory    = flag.String("default-memory", "512Mi", "memory reserved for a sandbox whose template sets none and whose snapshot no node reports")
		workers      = flag.Int("workers", 8, "Sandboxes reconciled at once (a fork that pulls holds one for minutes)")
		metricsAddr  = flag.String("metrics-bind-address", ":8080", "metrics endpoint (0: off)")
		probeAddr    = flag.String("health-probe-bind-address", ":8081", "healthz and readyz endpoint")
		leaderElect  = flag.Bool("leader-elect", true, "elect a leader, so only one replica acts")
		gwListen     = flag.String("gateway-listen", "", "serve forkd's REST API for the whole cluster on HOST:PORT (empty: off); the SDKs and forkd --host work against it unchanged")
		gwTokens     = flag.String("gateway-token-file", "/etc/forkd/gateway/tokens.json", "the gateway's callers: a token store in forkd's tokens.json format (forkd token create --token-file); a token's tenant is the namespace of its sandboxes")
		gwNamespace  = flag.String("gateway-namespace", "default", "namespace of the sandboxes of admin tokens (which have no tenant)")
		gwCert       = flag.String("gateway-tls-cert", "", "PEM certificate for --gateway-listen (required off loopback)")
		gwKey        = flag.String("gateway-tls-key", "", "PEM private key for --gateway-listen")
	)
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))

	if *namespace == "" {
		return fmt.Errorf("--namespace (or POD_NAMESPACE) is required")
	}
	sel, err := labels.Parse(*selector)
	if err != nil {
		return fmt.Errorf("--daemon-selector: %w", err)
	}
	mem, err := resource.ParseQuantity(*defMemory)
	if err != nil {
		return fmt.Errorf("--default-memory: %w", err)
	}
	token := ""
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	hc, err := httpClient(*caFile, *serverName)
	if err != nil {
		return err
	}
	scheme2, err := controller.NewScheme()
	if err != nil {
		return err
	}
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                  scheme2,
		Metrics:                 metricsserver.Options{BindAddress: *metricsAddr},
		HealthProbeBindAddress:  *probeAddr,
		LeaderElection:          *leaderElect,
		LeaderElectionID:        "forkd-controller.forkd.dev",
		LeaderElectionNamespace: *namespace,
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			// Only the daemon pods: the controller may not read others.
			&corev1.Pod{}: {Namespaces: map[string]cache.Config{*namespace: {}}, Label: sel},
		}},
	})
	if err != nil {
		return err
	}
	parts, err := controller.Setup(mgr, controller.Options{
		Discovery: &controller.PodDiscovery{
			Client: mgr.GetClient(), Namespace: *namespace, Selector: sel,
			Port: *port, Scheme: *scheme, MemoryShare: *memoryShare,
		},
		Token:                   token,
		HTTP:                    hc,
		PollInterval:            *pollInterval,
		FailureThreshold:        *threshold,
		DefaultMemoryBytes:      mem.Value(),
		MaxConcurrentReconciles: *workers,
		Events:                  mgr.GetEventRecorder("forkd-controller"),
	})
	if err != nil {
		return err
	}
	if *gwListen != "" {
		toks, err := gateway.LoadTokens(*gwTokens)
		if err != nil {
			return fmt.Errorf("--gateway-token-file: %w", err)
		}
		if err := gateway.AddIndexes(context.Background(), mgr.GetFieldIndexer().IndexField); err != nil {
			return err
		}
		if err := mgr.Add(&gateway.Server{
			Gateway: &gateway.Gateway{
				Client: mgr.GetClient(), Nodes: parts.Daemons, Tokens: toks, DefaultNamespace: *gwNamespace, Preplacer: parts.Sandboxes,
				Version: "forkd-controller", Log: ctrl.Log.WithName("gateway"),
			},
			Addr: *gwListen, CertFile: *gwCert, KeyFile: *gwKey,
		}); err != nil {
			return err
		}
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("readyz", healthz.Ping); err != nil {
		return err
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}

// httpClient is the client for the daemons: their CA and the name their
// certificate carries.
func httpClient(caFile, serverName string) (*http.Client, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--ca-file %s: no PEM certificate in it", caFile)
		}
		cfg.RootCAs = pool
	}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.TLSClientConfig = cfg
	t.TLSHandshakeTimeout = 10 * time.Second
	t.MaxIdleConnsPerHost = 8
	return &http.Client{Transport: t}, nil
}
