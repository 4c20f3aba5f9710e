//go:build ucx

#include "epucx.h"
#include "_cgo_export.h"

ucs_status_t epc_init(const char **names, const char **values, int n, ucp_context_h *ctx) {
    ucp_config_t *config;
    ucs_status_t status = ucp_config_read(NULL, NULL, &config);
    if (status != UCS_OK) {
        return status;
    }
    for (int i = 0; i < n; i++) {
        status = ucp_config_modify(config, names[i], values[i]);
        if (status != UCS_OK) {
            ucp_config_release(config);
            return status;
        }
    }
    ucp_params_t params = {
        .field_mask        = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED,
        .features          = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP,
        .mt_workers_shared = 1,
    };
    status = ucp_init(&params, config, ctx);
    ucp_config_release(config);
    return status;
}

ucs_status_t epc_worker_create(ucp_context_h ctx, ucp_worker_h *worker) {
    ucp_worker_params_t params = {
        .field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
        .thread_mode = UCS_THREAD_MODE_MULTI,
    };
    return ucp_worker_create(ctx, &params, worker);
}

static void epc_ep_failed(void *arg, ucp_ep_h ep, ucs_status_t status) {
    (void)ep;
    epcEndpointFailed((uintptr_t)arg, status);
}

ucs_status_t epc_ep_create(ucp_worker_h worker, const void *addr, uintptr_t handle, ucp_ep_h *ep) {
    ucp_ep_params_t params = {
        .field_mask        = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                             UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                             UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address           = (const ucp_address_t *)addr,
        .err_mode          = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler       = {.cb = epc_ep_failed, .arg = (void *)handle},
    };
    return ucp_ep_create(worker, &params, ep);
}

static void epc_done(void *request, ucs_status_t status, void *user_data) {
    (void)request;
    epcOpDone((uintptr_t)user_data, status, 0, 0);
}

static void epc_recv_done(void *request, ucs_status_t status, const ucp_tag_recv_info_t *info, void *user_data) {
    (void)request;
    size_t length = 0;
    uint64_t tag = 0;
    if (status == UCS_OK && info != NULL) {
        length = info->length;
        tag = info->sender_tag;
    }
    epcOpDone((uintptr_t)user_data, status, length, tag);
}

static ucp_request_param_t epc_param(uintptr_t op) {
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send      = epc_done,
        .user_data    = (void *)op,
    };
    return param;
}

ucs_status_ptr_t epc_ep_flush(ucp_ep_h ep, uintptr_t op) {
    ucp_request_param_t param = epc_param(op);
    return ucp_ep_flush_nbx(ep, &param);
}

ucs_status_ptr_t epc_ep_close(ucp_ep_h ep, int force, uintptr_t op) {
    ucp_request_param_t param = epc_param(op);
    if (force) {
        param.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = UCP_EP_CLOSE_FLAG_FORCE;
    }
    return ucp_ep_close_nbx(ep, &param);
}

ucs_status_ptr_t epc_tag_send(ucp_ep_h ep, const void *buf, size_t len, uint64_t tag, uintptr_t op) {
    ucp_request_param_t param = epc_param(op);
    return ucp_tag_send_nbx(ep, buf, len, tag, &param);
}

// The receive always completes through the callback (NO_IMM_CMPL): UCX
// 1.13 completes a receive that matches an unexpected message at once and
// leaves UCP_OP_ATTR_FIELD_RECV_INFO unfilled.
ucs_status_ptr_t epc_tag_recv(ucp_worker_h worker, void *buf, size_t len, uintptr_t op) {
    ucp_request_param_t param = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA |
                        UCP_OP_ATTR_FLAG_NO_IMM_CMPL,
        .cb.recv      = epc_recv_done,
        .user_data    = (void *)op,
    };
    return ucp_tag_recv_nbx(worker, buf, len, 0, 0, &param);
}
