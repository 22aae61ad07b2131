//! The template file: JSON in the provider's shape, read (bounded) and
//! checked.

use std::io::Read;
use std::path::Path;

use serde::Deserialize;

use super::usage;
use crate::cli::CliError;
use crate::events::chunk::{KakaoTemplate, MAX_TEXT_CHARS};
use crate::events::Template;

/// A template file as written: the provider's field names.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TemplateFile {
    #[serde(rename = "type")]
    kind: String,
    from: String,
    text: String,
    #[serde(default)]
    kakao_options: Option<KakaoFile>,
}

/// A template file's `kakaoOptions`: the Kakao channel and its approved
/// template.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct KakaoFile {
    pf_id: String,
    template_id: String,
}

/// The largest template file read: room for a text of [`MAX_TEXT_CHARS`]
/// characters, each escaped as `\uXXXX`, and the other fields.
pub const MAX_TEMPLATE_FILE_BYTES: u64 = 64 * 1024;

/// Reads and checks a template file.
pub fn read_template(path: &Path) -> Result<Template, CliError> {
    let cannot = |e: std::io::Error| usage(format!("{}: cannot read: {e}", path.display()));
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| {
            f.take(MAX_TEMPLATE_FILE_BYTES + 1)
                .read_to_string(&mut text)
        })
        .map_err(cannot)?;
    if text.len() as u64 > MAX_TEMPLATE_FILE_BYTES {
        return Err(usage(format!(
            "{}: the template file is over {MAX_TEMPLATE_FILE_BYTES} bytes (its text may have at most {MAX_TEXT_CHARS} characters)",
            path.display()
        )));
    }
    let t: TemplateFile = serde_json::from_str(&text).map_err(|e| {
        usage(format!(
            "{}:{}: not a template ({e}); expected {{\"type\": \"ATA\", \"from\": \"...\", \"text\": \"...\", \"kakaoOptions\": {{\"pfId\": \"...\", \"templateId\": \"...\"}}}}",
            path.display(),
            e.line()
        ))
    })?;
    let template = Template {
        kind: t.kind,
        from: t.from,
        text: t.text,
        kakao_options: t.kakao_options.map(|k| KakaoTemplate {
            pf_id: k.pf_id,
            template_id: k.template_id,
        }),
    };
    template
        .validate()
        .map_err(|e| usage(format!("{}: {e}", path.display())))?;
    Ok(template)
}
