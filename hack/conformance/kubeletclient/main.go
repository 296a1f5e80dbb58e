// Command kubeletclient talks to a DRA kubelet plugin exactly as the kubelet does, using the
// official generated gRPC code of k8s.io/kubelet: it reads the plugin's registration socket
// (GetInfo, NotifyRegistrationStatus), then calls NodePrepareResources and/or
// NodeUnprepareResources on the advertised endpoint over the chosen API version. It prints one
// JSON document on stdout so tests can assert on the wire-level results.
//
// Usage:
//
//	kubeletclient -registration-socket R [-api v1|v1beta1] [-prepare ns/name/uid,...]
//	              [-unprepare ns/name/uid,...] [-registered=true] [-reg-error TEXT]
//	              [-health v1|v1alpha1]
//
// With -health, the first NodeWatchResources message of that DRAResourceHealth version is
// included in the output.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	registration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

type device struct {
	RequestNames []string `json:"requestNames"`
	PoolName     string   `json:"poolName"`
	DeviceName   string   `json:"deviceName"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
	ShareID      *string  `json:"shareID,omitempty"`
}

type claimResult struct {
	Devices []device `json:"devices,omitempty"`
	Error   string   `json:"error"`
}

type deviceHealth struct {
	PoolName       string `json:"poolName"`
	DeviceName     string `json:"deviceName"`
	Health         string `json:"health"`
	LastUpdated    int64  `json:"lastUpdated"`
	TimeoutSeconds int64  `json:"timeoutSeconds"`
	Message        string `json:"message"`
}

type output struct {
	Info      map[string]any         `json:"info"`
	Health    []deviceHealth         `json:"health,omitempty"`
	API       string                 `json:"api"`
	Prepare   map[string]claimResult `json:"prepare,omitempty"`
	Unprepare map[string]claimResult `json:"unprepare,omitempty"`
}

func main() {
	regSocket := flag.String("registration-socket", "", "path of the plugin's registration socket")
	api := flag.String("api", "v1", "DRA API version to call: v1 or v1beta1")
	prepare := flag.String("prepare", "", "claims to prepare: ns/name/uid,...")
	unprepare := flag.String("unprepare", "", "claims to unprepare: ns/name/uid,...")
	registered := flag.Bool("registered", true, "what NotifyRegistrationStatus reports")
	regError := flag.String("reg-error", "", "error text sent with -registered=false")
	health := flag.String("health", "", "also read the first DRAResourceHealth message: v1 or v1alpha1")
	timeout := flag.Duration("timeout", 45*time.Second, "per-call timeout (the kubelet's default)")
	flag.Parse()
	if err := run(*regSocket, *api, *prepare, *unprepare, *registered, *regError, *health, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "kubeletclient:", err)
		os.Exit(1)
	}
}

func dial(path string) (*grpc.ClientConn, error) {
	return grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

func run(regSocket, api, prepare, unprepare string, registered bool, regError, health string, timeout time.Duration) error {
	if regSocket == "" {
		return fmt.Errorf("-registration-socket is required")
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	regConn, err := dial(regSocket)
	if err != nil {
		return err
	}
	defer regConn.Close()
	reg := registration.NewRegistrationClient(regConn)
	info, err := reg.GetInfo(ctx, &registration.InfoRequest{})
	if err != nil {
		return fmt.Errorf("GetInfo: %w", err)
	}
	if _, err := reg.NotifyRegistrationStatus(ctx, &registration.RegistrationStatus{
		PluginRegistered: registered, Error: regError,
	}); err != nil {
		return fmt.Errorf("NotifyRegistrationStatus: %w", err)
	}
	out := output{
		Info: map[string]any{
			"type": info.Type, "name": info.Name, "endpoint": info.Endpoint,
			"supportedVersions": info.SupportedVersions,
		},
		API: api,
	}
	conn, err := dial(info.Endpoint)
	if err != nil {
		return err
	}
	defer conn.Close()
	switch api {
	case "v1":
		err = callV1(ctx, drav1.NewDRAPluginClient(conn), prepare, unprepare, &out)
	case "v1beta1":
		err = callV1beta1(ctx, drav1beta1.NewDRAPluginClient(conn), prepare, unprepare, &out)
	default:
		err = fmt.Errorf("unknown -api %q (v1 or v1beta1)", api)
	}
	if err != nil {
		return err
	}
	if health != "" {
		if out.Health, err = firstHealth(ctx, conn, health); err != nil {
			return err
		}
	}
	return json.NewEncoder(os.Stdout).Encode(out)
}

// firstHealth opens the health stream the way the kubelet does and returns its first message.
func firstHealth(ctx context.Context, conn *grpc.ClientConn, version string) ([]deviceHealth, error) {
	streamCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var result []deviceHealth
	switch version {
	case "v1":
		stream, err := drahealthv1.NewDRAResourceHealthClient(conn).NodeWatchResources(streamCtx, &drahealthv1.NodeWatchResourcesRequest{})
		if err != nil {
			return nil, fmt.Errorf("v1 NodeWatchResources: %w", err)
		}
		msg, err := stream.Recv()
		if err != nil {
			return nil, fmt.Errorf("v1 NodeWatchResources: %w", err)
		}
		for _, d := range msg.Devices {
			result = append(result, deviceHealth{d.GetDevice().GetPoolName(), d.GetDevice().GetDeviceName(), d.Health.String(), d.LastUpdatedTime, d.HealthCheckTimeoutSeconds, d.Message})
		}
	case "v1alpha1":
		stream, err := drahealthv1alpha1.NewDRAResourceHealthClient(conn).NodeWatchResources(streamCtx, &drahealthv1alpha1.NodeWatchResourcesRequest{})
		if err != nil {
			return nil, fmt.Errorf("v1alpha1 NodeWatchResources: %w", err)
		}
		msg, err := stream.Recv()
		if err != nil {
			return nil, fmt.Errorf("v1alpha1 NodeWatchResources: %w", err)
		}
		for _, d := range msg.Devices {
			result = append(result, deviceHealth{d.GetDevice().GetPoolName(), d.GetDevice().GetDeviceName(), d.Health.String(), d.LastUpdatedTime, d.HealthCheckTimeoutSeconds, d.Message})
		}
	default:
		return nil, fmt.Errorf("unknown -health %q (v1 or v1alpha1)", version)
	}
	return result, nil
}

type claimRef struct{ namespace, name, uid string }

func parseClaims(text string) ([]claimRef, error) {
	var refs []claimRef
	for _, item := range strings.Split(text, ",") {
		if item == "" {
			continue
		}
		parts := strings.Split(item, "/")
		if len(parts) != 3 {
			return nil, fmt.Errorf("claim %q is not namespace/name/uid", item)
		}
		refs = append(refs, claimRef{parts[0], parts[1], parts[2]})
	}
	return refs, nil
}

func callV1(ctx context.Context, client drav1.DRAPluginClient, prepare, unprepare string, out *output) error {
	if refs, err := parseClaims(prepare); err != nil {
		return err
	} else if len(refs) > 0 {
		req := &drav1.NodePrepareResourcesRequest{}
		for _, r := range refs {
			req.Claims = append(req.Claims, &drav1.Claim{Namespace: r.namespace, Name: r.name, Uid: r.uid})
		}
		resp, err := client.NodePrepareResources(ctx, req)
		if err != nil {
			return fmt.Errorf("v1 NodePrepareResources: %w", err)
		}
		out.Prepare = map[string]claimResult{}
		for uid, res := range resp.Claims {
			cr := claimResult{Error: res.Error}
			for _, d := range res.Devices {
				cr.Devices = append(cr.Devices, device{d.RequestNames, d.PoolName, d.DeviceName, d.CdiDeviceIds, d.ShareId})
			}
			out.Prepare[uid] = cr
		}
	}
	if refs, err := parseClaims(unprepare); err != nil {
		return err
	} else if len(refs) > 0 {
		req := &drav1.NodeUnprepareResourcesRequest{}
		for _, r := range refs {
			req.Claims = append(req.Claims, &drav1.Claim{Namespace: r.namespace, Name: r.name, Uid: r.uid})
		}
		resp, err := client.NodeUnprepareResources(ctx, req)
		if err != nil {
			return fmt.Errorf("v1 NodeUnprepareResources: %w", err)
		}
		out.Unprepare = map[string]claimResult{}
		for uid, res := range resp.Claims {
			out.Unprepare[uid] = claimResult{Error: res.Error}
		}
	}
	return nil
}

func callV1beta1(ctx context.Context, client drav1beta1.DRAPluginClient, prepare, unprepare string, out *output) error {
	if refs, err := parseClaims(prepare); err != nil {
		return err
	} else if len(refs) > 0 {
		req := &drav1beta1.NodePrepareResourcesRequest{}
		for _, r := range refs {
			req.Claims = append(req.Claims, &drav1beta1.Claim{Namespace: r.namespace, Name: r.name, Uid: r.uid})
		}
		resp, err := client.NodePrepareResources(ctx, req)
		if err != nil {
			return fmt.Errorf("v1beta1 NodePrepareResources: %w", err)
		}
		out.Prepare = map[string]claimResult{}
		for uid, res := range resp.Claims {
			cr := claimResult{Error: res.Error}
			for _, d := range res.Devices {
				cr.Devices = append(cr.Devices, device{d.RequestNames, d.PoolName, d.DeviceName, d.CdiDeviceIds, nil})
			}
			out.Prepare[uid] = cr
		}
	}
	if refs, err := parseClaims(unprepare); err != nil {
		return err
	} else if len(refs) > 0 {
		req := &drav1beta1.NodeUnprepareResourcesRequest{}
		for _, r := range refs {
			req.Claims = append(req.Claims, &drav1beta1.Claim{Namespace: r.namespace, Name: r.name, Uid: r.uid})
		}
		resp, err := client.NodeUnprepareResources(ctx, req)
		if err != nil {
			return fmt.Errorf("v1beta1 NodeUnprepareResources: %w", err)
		}
		out.Unprepare = map[string]claimResult{}
		for uid, res := range resp.Claims {
			out.Unprepare[uid] = claimResult{Error: res.Error}
		}
	}
	return nil
}
