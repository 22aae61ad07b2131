//! The template file: JSON in the provider's shape, read (bounded) and
//! checked.

use std::io::Read;
use std::path::Path;

use serde::Deserialize;

use super::usage;
use super::InputError;
use crate::events::chunk::{KakaoTemplate, MAX_TEXT_CHARS};
use crate::events::Template;

/// A template as a template file (and `POST /v1/batches`) writes it: the
/// provider's field names.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = Template)]
pub struct TemplateFile {
    /// `SMS`, `LMS`, `ATA` (AlimTalk) or `CTA`.
    #[serde(rename = "type")]
    #[schema(pattern = "^(SMS|LMS|ATA|CTA)$")]
    pub kind: String,
    /// The sender number (not blank, at most 32 characters).
    #[schema(pattern = "\\S", max_length = 32)]
    pub from: String,
    /// The text, at most 4000 characters, with `#{name}` placeholders.
    #[schema(max_length = 4000)]
    pub text: String,
    /// Required for `ATA` and `CTA`.
    #[serde(default)]
    pub kakao_options: Option<KakaoFile>,
}

/// A template file's `kakaoOptions`: the Kakao channel and its approved
/// template.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = KakaoOptions)]
pub struct KakaoFile {
    /// The Kakao channel id.
    #[schema(max_length = 128)]
    pub pf_id: String,
    /// The approved template's id.
    #[schema(max_length = 128)]
    pub template_id: String,
}

/// The largest template file read: room for a text of [`MAX_TEXT_CHARS`]
/// characters, each escaped as `\uXXXX`, and the other fields.
pub const MAX_TEMPLATE_FILE_BYTES: u64 = 64 * 1024;

/// Reads and checks a template file.
pub(crate) fn read_template(path: &Path) -> Result<Template, InputError> {
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
            "{}:{}: not a template ({e}); expected {SHAPE}",
            path.display(),
            e.line()
        ))
    })?;
    let template = t.into_template();
    template
        .validate()
        .map_err(|e| usage(format!("{}: {e}", path.display())))?;
    Ok(template)
}

/// What a template looks like, for messages.
const SHAPE: &str = "{\"type\": \"ATA\", \"from\": \"...\", \"text\": \"...\", \"kakaoOptions\": {\"pfId\": \"...\", \"templateId\": \"...\"}}";

impl TemplateFile {
    fn into_template(self) -> Template {
        Template {
            kind: self.kind,
            from: self.from,
            text: self.text,
            kakao_options: self.kakao_options.map(|k| KakaoTemplate {
                pf_id: k.pf_id,
                template_id: k.template_id,
            }),
        }
    }
}

impl TemplateFile {
    /// The template, checked (the error says what is wrong): what
    /// `POST /v1/batches` takes.
    pub fn checked(self) -> Result<Template, String> {
        let template = self.into_template();
        template.validate().map_err(|e| e.to_string())?;
        Ok(template)
    }
}
