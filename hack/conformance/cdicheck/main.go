// Command cdicheck loads CDI spec directories with the reference implementation
// (tags.cncf.io/container-device-interface, the library containerd and CRI-O use), injects the
// given device IDs into an empty OCI runtime spec and prints the result as JSON, so tests can
// check that the specs the plugin writes load and inject what they promise.
//
// Usage: cdicheck -spec-dir DIR[,DIR...] ID [ID...]
//
// Output: {"specErrors": {file: [msg]}, "devices": [...], "unresolved": [...], "error": "...",
// "oci": {...}}. The exit status is 0 even when injection fails: the JSON says why.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

type result struct {
	SpecErrors map[string][]string `json:"specErrors"`
	Devices    []string            `json:"devices"`
	Unresolved []string            `json:"unresolved"`
	Error      string              `json:"error"`
	OCI        *oci.Spec           `json:"oci"`
}

func main() {
	specDirs := flag.String("spec-dir", "", "comma-separated CDI spec directories (later = higher priority)")
	flag.Parse()
	if *specDirs == "" {
		fmt.Fprintln(os.Stderr, "cdicheck: -spec-dir is required")
		os.Exit(2)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(strings.Split(*specDirs, ",")...), cdi.WithAutoRefresh(false))
	if err != nil {
		fmt.Fprintln(os.Stderr, "cdicheck:", err)
		os.Exit(1)
	}
	_ = cache.Refresh() // errors are reported per spec file below
	res := result{SpecErrors: map[string][]string{}, Devices: cache.ListDevices()}
	for file, errs := range cache.GetErrors() {
		for _, e := range errs {
			res.SpecErrors[file] = append(res.SpecErrors[file], e.Error())
		}
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if ids := flag.Args(); len(ids) > 0 {
		unresolved, err := cache.InjectDevices(spec, ids...)
		res.Unresolved = unresolved
		if err != nil {
			res.Error = err.Error()
		}
	}
	res.OCI = spec
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		fmt.Fprintln(os.Stderr, "cdicheck:", err)
		os.Exit(1)
	}
}
