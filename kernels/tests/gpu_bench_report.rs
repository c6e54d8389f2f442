//! The GPU benchmark's arguments, plan, statistics, JSON and table (`benches/gpu_report`), checked without a GPU:
//! the benchmark runs on the lent GPU in one call, so everything that needs no device is proven here first.

#[path = "../benches/gpu_report/mod.rs"]
mod gpu_report;

use gpu_report::{plan, Opts, Report, Row, Stats};

fn parse(args: &[&str]) -> Result<Option<Opts>, String> {
    Opts::parse(args.iter().map(|s| s.to_string()))
}

#[test]
fn arguments() {
    let o = parse(&[]).unwrap().unwrap();
    assert!(!o.quick && o.json.is_none() && o.filters.is_empty() && !o.list);
    assert_eq!((o.rounds, o.round_ms), (11, 3.0));
    // What `cargo bench -- --quick gemv` passes: cargo's own `--bench` first, a bare filter.
    let o = parse(&[
        "--bench",
        "--quick",
        "--json",
        "/tmp/x.json",
        "gemv",
        "--filter",
        "attn",
    ])
    .unwrap()
    .unwrap();
    assert!(o.quick);
    assert_eq!((o.rounds, o.round_ms), (5, 1.5));
    assert_eq!(o.json.as_deref(), Some("/tmp/x.json"));
    assert_eq!(o.filters, ["gemv", "attn"]);
    assert!(
        o.wants("fp8_gemv/n=5120,k=17408/m=1")
            && o.wants("attn_decode/b=1")
            && !o.wants("copy/mib=256")
    );
    assert_eq!(
        parse(&["--rounds", "7", "--round-ms", "0.5"])
            .unwrap()
            .unwrap()
            .rounds,
        7
    );
    assert_eq!(parse(&["--help"]).unwrap(), None);
    for bad in [
        &["--json"][..],
        &["--rounds", "0"],
        &["--rounds", "x"],
        &["--round-ms", "-1"],
        &["--nope"],
    ] {
        assert!(parse(bad).is_err(), "{bad:?} was accepted");
    }
}

#[test]
fn plan_names_are_unique_and_cover_the_table() {
    for quick in [false, true] {
        let names: Vec<String> = plan(quick)
            .iter()
            .flat_map(|g| g.rows())
            .map(|(n, _)| n)
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(
            sorted.len(),
            names.len(),
            "duplicate row names (quick = {quick})"
        );
        // Every family of benchmarks/h200.md's table has rows, and its target shapes are there in quick mode too.
        for want in [
            "copy/mib=256",
            "fp8_gemv/n=248320,k=5120/m=16",
            "nvfp4_gemv/n=5120,k=10240/m=1",
            "nvfp4_step_norm/n=17408,k=5120/m=4",
            "fp8_gemm/n=17408,k=5120/m=4096",
            "nvfp4_gemm/n=5120,k=17408/m=4096",
            "gdn_decode/hk=16,hv=48/b=32",
            "gdn_prefill/hk=16,hv=48,t=4096/seqs=1",
            "attn_decode/b=1,hq=24,hkv=4,d=256,page=64/ctx=32768",
            "attn_prefill/hq=24,hkv=4,d=256,window=1024/t=16384",
            "attn_prefill_paged/hq=24,hkv=4,d=256,page=64,prefix=8192/t=2048",
            "bf16_gemv/n=248320,k=5120/m=1",
            "rmsnorm/dim=5120/rows=4096",
            "sample/vocab=248320,top_k=20/rows=1",
        ] {
            assert!(
                names.iter().any(|n| n == want),
                "{want} missing (quick = {quick})"
            );
        }
    }
    // Every group names the parameters its runner reads.
    for g in plan(false) {
        let needs: &[&str] = match g.family {
            "fp8_gemv" | "nvfp4_gemv" | "bf16_gemv" | "fp8_gemm" | "nvfp4_gemm" => &["n", "k"],
            "gdn_decode" => &["hk", "hv"],
            "gdn_prefill" | "gdn_prefill_f16" => &["hk", "hv", "t"],
            "attn_decode" => &["b", "hq", "hkv", "d", "page"],
            "attn_prefill" => &["hq", "hkv", "d", "window"],
            _ => &[],
        };
        for k in needs {
            g.get(k);
        }
    }
}

#[test]
fn stats_median_and_spread() {
    let s = Stats::of(&[3.0, 1.0, 2.0]).unwrap();
    assert_eq!((s.median, s.spread), (2.0, 1.0));
    assert_eq!(Stats::of(&[1.0, 2.0, 4.0, 3.0]).unwrap().median, 2.5);
    assert_eq!(Stats::of(&[]), None);
    assert_eq!(Stats::of(&[1.0, f64::NAN]), None);
}

fn row(
    name: &str,
    us: Option<f64>,
    bytes: Option<f64>,
    flops: Option<f64>,
    error: Option<&str>,
) -> Row {
    Row {
        name: name.into(),
        family: "fp8_gemv",
        call: "Gpu::fp8_gemv_tiles",
        params: vec![("n", 5120), ("k", 17408), ("m", 1)],
        timing: "graph",
        reps: 140,
        rounds: 11,
        sets: 3,
        stats: us.map(|u| Stats {
            median: u * 1e-6,
            spread: 0.02,
        }),
        bytes,
        flops,
        error: error.map(str::to_string),
    }
}

#[test]
fn json_and_table() {
    let report = Report {
        device: Some("NVIDIA H200 \"SXM\"".into()),
        skipped: None,
        quick: true,
        copy_gbps: Some(4000.0),
        rows: vec![
            row(
                "fp8_gemv/n=5120,k=17408/m=1",
                Some(25.0),
                Some(100e6),
                None,
                None,
            ),
            row("fp8_gemm/x", Some(1000.0), None, Some(2e12), None),
            row(
                "broken",
                None,
                None,
                None,
                Some("cuda::x: bad\nsecond line"),
            ),
        ],
    };
    let j = report.to_json();
    let v: serde_json::Value = serde_json::from_str(&j).unwrap();
    assert_eq!(v["schema"], "edgefit-gpu-bench/1");
    assert_eq!(v["device"], "NVIDIA H200 \"SXM\"");
    assert_eq!(v["copy_GBps"], 4000.0);
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    // 100 MB in 25 us = 4000 GB/s = all of copy; 2 TFLOP in 1 ms = 2000 TFLOP/s.
    let close = |x: &serde_json::Value, want: f64| (x.as_f64().unwrap() / want - 1.0).abs() < 1e-9;
    assert!(
        close(&rows[0]["us"], 25.0)
            && close(&rows[0]["GBps"], 4000.0)
            && close(&rows[0]["of_copy"], 1.0)
    );
    assert_eq!(
        rows[0]["params"],
        serde_json::json!({"n": 5120, "k": 17408, "m": 1})
    );
    assert_eq!(rows[0]["TFLOPs"], serde_json::Value::Null);
    assert!(close(&rows[1]["TFLOPs"], 2000.0) && rows[1]["of_copy"].is_null());
    assert_eq!(rows[2]["error"], "cuda::x: bad\nsecond line");
    assert!(rows[2]["us"].is_null() && rows[2]["spread"].is_null());
    let t = report.table();
    assert!(t.lines().next().unwrap().contains("copy 4000 GB/s"));
    assert!(
        t.contains("100.0%")
            && t.contains("2000.0")
            && t.contains("broken")
            && t.contains("FAILED: cuda::x: bad")
    );
    assert!(!t.contains("second line"));

    let skipped = Report {
        device: None,
        skipped: Some("no CUDA device".into()),
        quick: false,
        copy_gbps: None,
        rows: vec![],
    };
    let v: serde_json::Value = serde_json::from_str(&skipped.to_json()).unwrap();
    assert_eq!(v["skipped"], "no CUDA device");
    assert!(
        v["device"].is_null()
            && v["copy_GBps"].is_null()
            && v["rows"].as_array().unwrap().is_empty()
    );
}
