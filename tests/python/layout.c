/*
 * Prints the size of each public struct of include/lnorm/lnorm.h and the
 * offset of each of its fields as JSON, for test_layout.py to compare with
 * the ctypes declarations of the Python package (client/python/src/lnorm/_lib.py).
 */
#include <stddef.h>
#include <stdio.h>

#include "lnorm/lnorm.h"

#define BEGIN(T) printf("%s\"%s\": {\"size\": %zu, \"fields\": {", first++ ? ", " : "", #T, sizeof(T)), nf = 0
#define F(T, f) printf("%s\"%s\": %zu", nf++ ? ", " : "", #f, offsetof(T, f))
#define END() printf("}}")

int main(void)
{
    int first = 0, nf = 0;
    printf("{");
    BEGIN(lnorm_client_opts);
    F(lnorm_client_opts, send_timeout_ms); F(lnorm_client_opts, recv_timeout_ms);
    F(lnorm_client_opts, reconnect_min_ms); F(lnorm_client_opts, reconnect_max_ms);
    F(lnorm_client_opts, resend_ms); F(lnorm_client_opts, chunk_bytes);
    F(lnorm_client_opts, pipeline_depth); F(lnorm_client_opts, max_recv_bytes);
    F(lnorm_client_opts, send_deadline); F(lnorm_client_opts, tls_ca_file);
    F(lnorm_client_opts, tls_cert_key_file); F(lnorm_client_opts, tls_server_name);
    F(lnorm_client_opts, tls_insecure);
    F(lnorm_client_opts, auto_shm_bytes);
    END();
    BEGIN(lnorm_result);
    F(lnorm_result, err); F(lnorm_result, status); F(lnorm_result, message);
    F(lnorm_result, queue_us); F(lnorm_result, compute_us); F(lnorm_result, batch_rows);
    F(lnorm_result, batch_requests); F(lnorm_result, chunks);
    END();
    BEGIN(lnorm_normalize_req);
    F(lnorm_normalize_req, op); F(lnorm_normalize_req, x_dtype); F(lnorm_normalize_req, y_dtype);
    F(lnorm_normalize_req, rows); F(lnorm_normalize_req, hidden); F(lnorm_normalize_req, eps);
    F(lnorm_normalize_req, eps_mode); F(lnorm_normalize_req, x); F(lnorm_normalize_req, residual);
    F(lnorm_normalize_req, param_dtype); F(lnorm_normalize_req, gamma); F(lnorm_normalize_req, beta);
    F(lnorm_normalize_req, params_id); F(lnorm_normalize_req, want_stats); F(lnorm_normalize_req, y);
    F(lnorm_normalize_req, mean); F(lnorm_normalize_req, rstd); F(lnorm_normalize_req, residual_out);
    F(lnorm_normalize_req, timeout_ms); F(lnorm_normalize_req, chunk_bytes);
    F(lnorm_normalize_req, priority); F(lnorm_normalize_req, max_queue_us);
    END();
    BEGIN(lnorm_normalize_backward_req);
    F(lnorm_normalize_backward_req, op); F(lnorm_normalize_backward_req, x_dtype);
    F(lnorm_normalize_backward_req, dy_dtype); F(lnorm_normalize_backward_req, dx_dtype);
    F(lnorm_normalize_backward_req, rows); F(lnorm_normalize_backward_req, hidden);
    F(lnorm_normalize_backward_req, eps); F(lnorm_normalize_backward_req, eps_mode);
    F(lnorm_normalize_backward_req, x); F(lnorm_normalize_backward_req, dy); F(lnorm_normalize_backward_req, dres);
    F(lnorm_normalize_backward_req, param_dtype); F(lnorm_normalize_backward_req, gamma);
    F(lnorm_normalize_backward_req, params_id); F(lnorm_normalize_backward_req, mean);
    F(lnorm_normalize_backward_req, rstd); F(lnorm_normalize_backward_req, dx);
    F(lnorm_normalize_backward_req, dgamma); F(lnorm_normalize_backward_req, dbeta);
    F(lnorm_normalize_backward_req, timeout_ms); F(lnorm_normalize_backward_req, chunk_bytes);
    F(lnorm_normalize_backward_req, priority); F(lnorm_normalize_backward_req, max_queue_us);
    END();
    BEGIN(lnorm_params_desc);
    F(lnorm_params_desc, id); F(lnorm_params_desc, dtype); F(lnorm_params_desc, hidden);
    F(lnorm_params_desc, gamma); F(lnorm_params_desc, beta);
    END();
    BEGIN(lnorm_device_desc);
    F(lnorm_device_desc, backend); F(lnorm_device_desc, name); F(lnorm_device_desc, memory_bytes);
    F(lnorm_device_desc, index);
    END();
    BEGIN(lnorm_server_info);
    F(lnorm_server_info, version); F(lnorm_server_info, nbackends); F(lnorm_server_info, backends);
    F(lnorm_server_info, ndevices); F(lnorm_server_info, devices);
    F(lnorm_server_info, max_message_bytes); F(lnorm_server_info, max_rows);
    F(lnorm_server_info, max_hidden); F(lnorm_server_info, max_batch_rows);
    F(lnorm_server_info, max_batch_bytes); F(lnorm_server_info, max_queue_requests);
    F(lnorm_server_info, max_params_bytes); F(lnorm_server_info, max_inflight_bytes);
    F(lnorm_server_info, shm);
    END();
    printf("}\n");
    return 0;
}
