// Command noop-webhook is the floor of the webhook benchmark (bench/webhook_bench.py): an
// admission webhook that costs next to nothing. Every AdmissionReview POSTed to it, on any
// path, is answered "allowed"; with -mutate-patch, those POSTed to /mutate-pods carry that
// JSONPatch (the bench removes the pods' legacy resources with it, so that what follows the
// admission is alike for the floor and for vgpu-dra's webhook: in particular the API server
// then skips the validating webhook for the floor's pods too, as it does for translated ones).
// What the API server's admission histogram reports for it on the bench machine is the part
// of the figure that no webhook can remove; the difference to vgpu-dra's webhook is ours.
//
// It serves HTTP/1.1 only (no ALPN "h2"), like our webhook and like every webhook the API
// server reaches through a Service, and counts what the client offered and what was used:
// GET /stats answers with those counts, the new connections, and the time each admission took
// inside the handler per path, so the bench can check the protocol of the pass it measured.
//
// Standard library only; TLS from -cert and -key (PEM files).
package main

import (
	"crypto/tls"
	"encoding/json"
	"flag"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

const maxBody = 4 << 20 // as the Python webhook: two objects of at most ~1.5 MiB, plus slack

type review struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Request    *struct {
		UID string `json:"uid"`
	} `json:"request"`
}

type response struct {
	UID       string `json:"uid"`
	Allowed   bool   `json:"allowed"`
	PatchType string `json:"patchType,omitempty"`
	Patch     []byte `json:"patch,omitempty"` // base64 in JSON, as the API expects
}

type answer struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Response   response `json:"response"`
}

// stats are what GET /stats reports; guarded by mu.
type stats struct {
	mu          sync.Mutex
	Connections int                  `json:"connections"`
	ALPNOffered map[string]int       `json:"alpn_offered"` // per handshake: the client's list, comma-joined
	Protocols   map[string]int       `json:"protocols"`    // per admission: the request's HTTP version
	DurationsMS map[string][]float64 `json:"durations_ms"` // per path, per admission, in order
}

func (s *stats) count(field map[string]int, key string) {
	s.mu.Lock()
	field[key]++
	s.mu.Unlock()
}

func main() {
	listen := flag.String("listen", "127.0.0.1:9443", "address to serve on")
	certFile := flag.String("cert", "", "PEM serving certificate")
	keyFile := flag.String("key", "", "PEM key of the serving certificate")
	mutatePatch := flag.String("mutate-patch", "", "JSONPatch (JSON text) for POST /mutate-pods")
	flag.Parse()
	var patch []byte
	if *mutatePatch != "" {
		if !json.Valid([]byte(*mutatePatch)) {
			log.Fatalf("noop-webhook: -mutate-patch is not JSON")
		}
		patch = []byte(*mutatePatch)
	}
	cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
	if err != nil {
		log.Fatalf("noop-webhook: %v", err)
	}
	st := &stats{
		ALPNOffered: map[string]int{},
		Protocols:   map[string]int{},
		DurationsMS: map[string][]float64{},
	}
	base := &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"http/1.1"},
	}
	config := base.Clone()
	config.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		st.count(st.ALPNOffered, strings.Join(hello.SupportedProtos, ","))
		return base, nil
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		st.mu.Lock()
		body, _ := json.Marshal(st)
		st.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})
	mux.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		started := time.Now()
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		var in review
		if err == nil {
			err = json.Unmarshal(body, &in)
		}
		if err != nil || in.Request == nil || in.Kind != "AdmissionReview" {
			http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
			return
		}
		reply := response{UID: in.Request.UID, Allowed: true}
		if patch != nil && r.URL.Path == "/mutate-pods" {
			reply.PatchType, reply.Patch = "JSONPatch", patch
		}
		out, _ := json.Marshal(answer{
			APIVersion: "admission.k8s.io/v1",
			Kind:       "AdmissionReview",
			Response:   reply,
		})
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(out)
		elapsed := time.Since(started)
		st.mu.Lock()
		st.Protocols[r.Proto]++
		st.DurationsMS[r.URL.Path] = append(st.DurationsMS[r.URL.Path], float64(elapsed.Microseconds())/1e3)
		st.mu.Unlock()
	})
	server := &http.Server{
		Addr:      *listen,
		Handler:   mux,
		TLSConfig: config,
		// A non-nil empty map: no HTTP/2, whatever the client offers.
		TLSNextProto:      map[string]func(*http.Server, *tls.Conn, http.Handler){},
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second, // as the Python webhook: longer than the client's 90 s
		ConnState: func(_ net.Conn, state http.ConnState) {
			if state == http.StateNew {
				st.mu.Lock()
				st.Connections++
				st.mu.Unlock()
			}
		},
	}
	log.Printf("noop-webhook on https://%s", *listen)
	log.Fatal(server.ListenAndServeTLS("", ""))
}
