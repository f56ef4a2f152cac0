//! Compiles in the hooks of this crate's own tests (`cuda_ipc::__testing`, not API) when
//! `CUDA_IPC_TEST_HOOKS=1`, which the repository's `.cargo/config.toml` sets for builds inside
//! it: a cfg rather than a feature, so that no user is offered them.

fn main() {
    println!("cargo::rerun-if-env-changed=CUDA_IPC_TEST_HOOKS");
    println!("cargo::rustc-check-cfg=cfg(cuda_ipc_test_hooks)");
    if std::env::var_os("CUDA_IPC_TEST_HOOKS").is_some_and(|v| v == "1") {
        println!("cargo::rustc-cfg=cuda_ipc_test_hooks");
    }
}
