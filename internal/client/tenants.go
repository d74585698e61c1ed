package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/forkd-dev/forkd/internal/apiv1"
)

// ShareSnapshot shares a tag the caller's tenant owns with tenant
// (apiv1.ShareAll: every tenant), read-only: it may see and fork it.
func (c *Client) ShareSnapshot(ctx context.Context, tag, tenant string) (apiv1.Snapshot, error) {
	var out apiv1.Snapshot
	return out, c.call(ctx, http.MethodPut, sharePath(tag, tenant), nil, nil, &out)
}

// UnshareSnapshot ends a share; what the other tenant already made from
// the tag stays theirs.
func (c *Client) UnshareSnapshot(ctx context.Context, tag, tenant string) (apiv1.Snapshot, error) {
	var out apiv1.Snapshot
	return out, c.call(ctx, http.MethodDelete, sharePath(tag, tenant), nil, nil, &out)
}

func sharePath(tag, tenant string) string {
	return "/v1/snapshots/" + url.PathEscape(tag) + "/shares/" + url.PathEscape(tenant)
}

// Tenants lists the tenants with their quotas and use (a non-admin token
// sees its own tenant only).
func (c *Client) Tenants(ctx context.Context) ([]apiv1.Tenant, error) {
	return listAll[apiv1.Tenant](ctx, c, "/v1/tenants", nil)
}

// Tenant shows one tenant (apiv1.QuotaDefaultTenant: the default quota).
func (c *Client) Tenant(ctx context.Context, name string) (apiv1.Tenant, error) {
	var out apiv1.Tenant
	return out, c.call(ctx, http.MethodGet, "/v1/tenants/"+url.PathEscape(name), nil, nil, &out)
}

// SetQuota sets a tenant's quota (apiv1.QuotaDefaultTenant: the default
// for tenants without one; all zero removes it). Admin only.
func (c *Client) SetQuota(ctx context.Context, tenant string, q apiv1.Quota) (apiv1.Tenant, error) {
	var out apiv1.Tenant
	return out, c.call(ctx, http.MethodPut, "/v1/tenants/"+url.PathEscape(tenant)+"/quota", nil, q, &out)
}
