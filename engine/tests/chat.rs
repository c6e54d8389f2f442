//! Chat templates rendered as transformers renders them: real templates (Qwen3's ChatML with thinking and tools,
//! Gemma 3's, Llama 3.2's) over cases whose expected text `tests/chat/make_expected.py` produced with transformers'
//! own `render_jinja_template`, including the errors a template raises.

use std::path::Path;

use engine::chat::{ChatTemplate, RenderOptions};
use minijinja::Value;

fn dir() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/chat"))
}

fn read_json(name: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join(name)).unwrap()).unwrap()
}

#[test]
fn real_templates_render_as_transformers_does() {
    // Read the cases as text into minijinja values so maps keep the key order of the file, as Python dicts do.
    let raw = std::fs::read_to_string(dir().join("cases.json")).unwrap();
    let cases: Vec<Value> = serde_json::from_str(&raw).unwrap();
    let expected = read_json("expected.json");
    let expected = expected["cases"].as_array().unwrap();
    assert_eq!(cases.len(), expected.len());
    let mut checked = 0;
    for (case, want) in cases.iter().zip(expected) {
        let name = case.get_attr("name").unwrap().to_string();
        assert_eq!(want["name"].as_str().unwrap(), name);
        let tname = case.get_attr("template").unwrap().to_string();
        let source = std::fs::read_to_string(dir().join(format!("{tname}.jinja"))).unwrap();
        let special: Vec<(String, String)> = match case.get_attr("special").unwrap() {
            v if v.is_undefined() => Vec::new(),
            v => v
                .try_iter()
                .unwrap()
                .map(|k| (k.to_string(), v.get_item(&k).unwrap().to_string()))
                .collect(),
        };
        let t = ChatTemplate::new(vec![("default".into(), source)], special).unwrap();
        let extra: Vec<(String, Value)> = match case.get_attr("kwargs").unwrap() {
            v if v.is_undefined() => Vec::new(),
            v => v
                .try_iter()
                .unwrap()
                .map(|k| (k.to_string(), v.get_item(&k).unwrap()))
                .collect(),
        };
        let tools = case.get_attr("tools").unwrap();
        let opts = RenderOptions {
            add_generation_prompt: case.get_attr("add_generation_prompt").unwrap().is_true(),
            tools: (!tools.is_undefined()).then_some(tools),
            extra,
        };
        let got = t.render(&case.get_attr("messages").unwrap(), &opts);
        match (want.get("rendered"), got) {
            (Some(w), Ok(g)) => assert_eq!(g, w.as_str().unwrap(), "case {name}"),
            (None, Err(e)) => {
                let w = want["error"].as_str().unwrap();
                assert!(
                    e.to_string().contains(w),
                    "case {name}: error {e} should carry {w:?}"
                );
            }
            (w, g) => panic!("case {name}: expected {w:?}, got {g:?}"),
        }
        checked += 1;
    }
    assert_eq!(checked, 11);
}

#[test]
fn strftime_now_gives_todays_date() {
    let t = ChatTemplate::new(
        vec![(
            "default".into(),
            std::fs::read_to_string(dir().join("llama3_2.jinja")).unwrap(),
        )],
        vec![("bos_token".into(), "<|begin_of_text|>".into())],
    )
    .unwrap();
    let msgs: Value = serde_json::from_str(r#"[{"role": "user", "content": "hi"}]"#).unwrap();
    let out = t.render(&msgs, &RenderOptions::default()).unwrap();
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let today = engine::chat::strftime(secs, "%d %b %Y");
    assert!(
        out.contains(&format!("Today Date: {today}\n")),
        "{out:?} should carry {today}"
    );
}

#[test]
fn fixture_template_is_chatml() {
    let fx = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/qwen3-f32"
    ));
    let t = ChatTemplate::open(fx)
        .unwrap()
        .expect("the fixture has a template");
    assert_eq!(
        t.render_user("hi").unwrap(),
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
    // A checkpoint without tokenizer_config.json has no template, which is not an error.
    assert!(ChatTemplate::open(dir()).unwrap().is_none());
}

#[test]
fn named_templates_prefer_tool_use_with_tools() {
    let t = ChatTemplate::new(
        vec![
            ("default".into(), "plain".into()),
            ("tool_use".into(), "tools:{{ tools | length }}".into()),
        ],
        Vec::new(),
    )
    .unwrap();
    let msgs = Value::from(Vec::<Value>::new());
    assert_eq!(t.render(&msgs, &RenderOptions::default()).unwrap(), "plain");
    let tools: Value = serde_json::from_str(r#"[{"type": "function"}]"#).unwrap();
    let opts = RenderOptions {
        tools: Some(tools),
        ..RenderOptions::default()
    };
    assert_eq!(t.render(&msgs, &opts).unwrap(), "tools:1");
}
