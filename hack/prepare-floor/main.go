// Command prepare-floor is the floor of the prepare benchmark (bench/prepare_bench.py): the least
// a DRA kubelet plugin can do per NodePrepareResources, built the way the users of the upstream
// helper (k8s.io/dynamic-resource-allocation/kubeletplugin, the dra-example-driver among them)
// build theirs. The helper serves the kubelet's gRPC API on unix sockets, GETs each claim of a
// call from the API server (one quorum read per claim) and hands the claims to this driver,
// which per claim:
//
//   - returns the recorded devices when the checkpoint already has the claim (kubelet retries);
//   - takes the allocation results of its driver, each in this node's pool on a known device
//     (gpu-0 .. gpu-<devices-1>), or fails that claim alone;
//   - writes the claim's transient CDI spec with the CDI reference library (temp file + rename,
//     not synced), then the checkpoint: the whole JSON document to a temp file in the same
//     directory, fsynced, renamed over the old one (one sync per prepare and one per unprepare).
//
// Unprepare removes the spec and the checkpoint entry; an unknown claim is a success. The API
// client's rate limit is raised to -qps (default 1,000) so that it never throttles the bench.
// No health service, no ResourceSlices: the bench drives the DRA socket only.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

const (
	cdiVendor = "k8s.prepare-floor"
	cdiClass  = "claim"
)

type checkpoint struct {
	Version int                                  `json:"version"`
	Claims  map[types.UID][]kubeletplugin.Device `json:"claims"`
}

type driver struct {
	name, node string
	devices    map[string]bool
	cdi        *cdiapi.Cache
	path       string // the checkpoint file

	mu       sync.Mutex
	prepared map[types.UID][]kubeletplugin.Device
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server")
	node := flag.String("node-name", "", "this node: the pool of the devices it prepares")
	name := flag.String("driver-name", "vgpu.dra.dev", "the driver whose allocation results it prepares")
	pluginDir := flag.String("plugin-dir", "", "directory of dra.sock")
	registrarDir := flag.String("registrar-dir", "", "directory of the registration socket")
	cdiRoot := flag.String("cdi-root", "", "where the CDI specs go")
	stateDir := flag.String("state-dir", "", "where the checkpoint goes")
	devices := flag.Int("devices", 8, "devices gpu-0 .. gpu-<n-1> on this node")
	qps := flag.Float64("qps", 1000, "API client QPS (and burst)")
	flag.Parse()

	config, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		klog.Fatalf("kubeconfig: %v", err)
	}
	config.QPS, config.Burst = float32(*qps), int(*qps)
	client, err := kubernetes.NewForConfig(config)
	if err != nil {
		klog.Fatalf("client: %v", err)
	}
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(*cdiRoot), cdiapi.WithAutoRefresh(false))
	if err != nil {
		klog.Fatalf("CDI cache: %v", err)
	}
	d := &driver{
		name:     *name,
		node:     *node,
		devices:  map[string]bool{},
		cdi:      cache,
		path:     filepath.Join(*stateDir, "checkpoint.json"),
		prepared: map[types.UID][]kubeletplugin.Device{},
	}
	for i := 0; i < *devices; i++ {
		d.devices[fmt.Sprintf("gpu-%d", i)] = true
	}
	for _, dir := range []string{*pluginDir, *registrarDir, *cdiRoot, *stateDir} {
		if err := os.MkdirAll(dir, 0o750); err != nil {
			klog.Fatalf("directory: %v", err)
		}
	}
	if err := d.load(); err != nil {
		klog.Fatalf("checkpoint: %v", err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(*node),
		kubeletplugin.DriverName(*name),
		kubeletplugin.PluginDataDirectoryPath(*pluginDir),
		kubeletplugin.RegistrarDirectoryPath(*registrarDir),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		klog.Fatalf("start: %v", err)
	}
	fmt.Printf("prepare-floor serving %s\n", filepath.Join(*pluginDir, "dra.sock"))
	<-ctx.Done()
	helper.Stop()
}

func (d *driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	results := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, claim := range claims {
		devices, err := d.prepare(claim)
		results[claim.UID] = kubeletplugin.PrepareResult{Devices: devices, Err: err}
	}
	return results, nil
}

func (d *driver) prepare(claim *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	if devices, ok := d.prepared[claim.UID]; ok {
		return devices, nil
	}
	spec := &cdispec.Spec{Kind: cdiVendor + "/" + cdiClass}
	var devices []kubeletplugin.Device
	for _, result := range claim.Status.Allocation.Devices.Results {
		if result.Driver != d.name {
			continue
		}
		if result.Pool != d.node || !d.devices[result.Device] {
			return nil, fmt.Errorf("device %s/%s is not on this node", result.Pool, result.Device)
		}
		cdiName := string(claim.UID) + "-" + result.Device
		if result.ShareID != nil {
			cdiName += "-" + string(*result.ShareID)
		}
		spec.Devices = append(spec.Devices, cdispec.Device{
			Name:           cdiName,
			ContainerEdits: cdispec.ContainerEdits{Env: []string{"FLOOR_DEVICE=" + result.Device}},
		})
		devices = append(devices, kubeletplugin.Device{
			Requests:     []string{result.Request},
			PoolName:     result.Pool,
			DeviceName:   result.Device,
			CDIDeviceIDs: []string{parser.QualifiedName(cdiVendor, cdiClass, cdiName)},
			ShareID:      result.ShareID,
		})
	}
	if len(devices) == 0 {
		return nil, fmt.Errorf("no devices of driver %s allocated", d.name)
	}
	version, err := cdiapi.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, err
	}
	spec.Version = version
	if err := d.cdi.WriteSpec(spec, d.specName(claim.UID)); err != nil {
		return nil, fmt.Errorf("write CDI spec: %w", err)
	}
	d.prepared[claim.UID] = devices
	if err := d.store(); err != nil {
		delete(d.prepared, claim.UID)
		_ = d.cdi.RemoveSpec(d.specName(claim.UID))
		return nil, err
	}
	return devices, nil
}

func (d *driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	results := make(map[types.UID]error, len(claims))
	for _, claim := range claims {
		results[claim.UID] = d.unprepare(claim.UID)
	}
	return results, nil
}

func (d *driver) unprepare(uid types.UID) error {
	if _, ok := d.prepared[uid]; !ok {
		return nil
	}
	if err := d.cdi.RemoveSpec(d.specName(uid)); err != nil {
		return fmt.Errorf("remove CDI spec: %w", err)
	}
	delete(d.prepared, uid)
	return d.store()
}

func (d *driver) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
}

func (d *driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func (d *driver) specName(uid types.UID) string {
	return cdiapi.GenerateTransientSpecName(cdiVendor, cdiClass, string(uid))
}

func (d *driver) load() error {
	data, err := os.ReadFile(d.path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	var document checkpoint
	if err := json.Unmarshal(data, &document); err != nil {
		return fmt.Errorf("%s: %w", d.path, err)
	}
	for uid, devices := range document.Claims {
		d.prepared[uid] = devices
	}
	return nil
}

// store writes the whole checkpoint: temp file in the same directory, fsync, rename.
func (d *driver) store() (err error) {
	data, err := json.Marshal(checkpoint{Version: 1, Claims: d.prepared})
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(d.path), "checkpoint-*.tmp")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err == nil {
		err = tmp.Sync()
	}
	if closeErr := tmp.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		return fmt.Errorf("write checkpoint: %w", err)
	}
	return os.Rename(tmp.Name(), d.path)
}
