//! Deterministic entity extraction from an email's text: tracking numbers (with
//! the carrier when the format tells it), order numbers, amounts with their
//! currency, dates, phone numbers, email addresses and URLs. Hand-written scanning,
//! no regular expressions and no model: the same text always gives the same
//! entities. Each span of text is claimed by at most one kind, in the order URLs,
//! email addresses, tracking numbers, order numbers, dates, amounts, phones, so a
//! digit run inside a URL is never also a phone number.

use chrono::NaiveDate;
use serde::Serialize;

/// Everything found in one text, each list in order of first appearance, without
/// repeats.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Entities {
    /// Parcel tracking numbers.
    pub tracking_numbers: Vec<TrackingNumber>,
    /// Order numbers, as written (`A-10482`, `112-4456789-1234567`).
    pub order_numbers: Vec<String>,
    /// Money amounts.
    pub amounts: Vec<Amount>,
    /// Calendar dates.
    pub dates: Vec<DateMention>,
    /// Times of day, as `HH:MM` (24-hour; "2 pm" and "2:30pm" too).
    pub times: Vec<String>,
    /// Phone numbers, as written.
    pub phone_numbers: Vec<String>,
    /// Email addresses, lowercased.
    pub email_addresses: Vec<String>,
    /// http(s) and www. URLs.
    pub urls: Vec<String>,
}

/// A tracking number and, when its format is distinctive, the carrier.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrackingNumber {
    /// The number, without spaces.
    pub value: String,
    /// `UPS`, `USPS`, `Amazon`, or `None` when only the context said "tracking".
    pub carrier: Option<&'static str>,
}

/// A money amount.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Amount {
    /// The amount.
    pub value: f64,
    /// ISO 4217 code.
    pub currency: &'static str,
    /// As written.
    pub text: String,
}

/// A date found in the text.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DateMention {
    /// ISO 8601 (`2025-05-14`).
    pub value: String,
    /// As written.
    pub text: String,
}

/// Extracts every entity of `text`.
pub fn extract(text: &str) -> Entities {
    let words = words(text);
    let mut claimed = vec![false; words.len()];
    let mut found = Entities::default();
    for (index, word) in words.iter().enumerate() {
        let bare = trim_punctuation(word.text);
        if let Some(url) = url(bare) {
            push_unique(&mut found.urls, url);
            claimed[index] = true;
        } else if let Some(address) = email_address(bare) {
            push_unique(&mut found.email_addresses, address);
            claimed[index] = true;
        }
    }
    tracking_numbers(&words, &mut claimed, &mut found.tracking_numbers);
    order_numbers(&words, &mut claimed, &mut found.order_numbers);
    dates(&words, &mut claimed, &mut found.dates);
    times(&words, &mut claimed, &mut found.times);
    amounts(&words, &mut claimed, &mut found.amounts);
    phone_numbers(&words, &mut claimed, &mut found.phone_numbers);
    found
}

/// Times of day: `14:00`, `9:30`, `2pm`, `2:30 pm`, as `HH:MM`.
fn times(words: &[Word<'_>], claimed: &mut [bool], found: &mut Vec<String>) {
    for (index, word) in words.iter().enumerate() {
        if claimed[index] {
            continue;
        }
        let bare = trim_punctuation(word.text).to_ascii_lowercase();
        let next = words.get(index + 1).map(|next| trim_punctuation(next.text).to_ascii_lowercase());
        let (clock, meridiem, taken) = match (bare.strip_suffix("am"), bare.strip_suffix("pm")) {
            (Some(clock), _) => (clock.to_owned(), Some(false), 1),
            (_, Some(clock)) => (clock.to_owned(), Some(true), 1),
            _ => match next.as_deref() {
                Some("am" | "a.m") => (bare.clone(), Some(false), 2),
                Some("pm" | "p.m") => (bare.clone(), Some(true), 2),
                _ => (bare.clone(), None, 1),
            },
        };
        let (hours, minutes) = match clock.split_once(':') {
            Some((hours, minutes)) if minutes.len() == 2 => (hours, minutes),
            None if meridiem.is_some() => (clock.as_str(), "00"),
            _ => continue,
        };
        let (Ok(mut hours), Ok(minutes)) = (hours.parse::<u32>(), minutes.parse::<u32>()) else { continue };
        if hours.to_string().len() > 2
            || minutes > 59
            || hours > 23
            || (meridiem.is_some() && !(1..=12).contains(&hours))
        {
            continue;
        }
        match meridiem {
            Some(true) if hours < 12 => hours += 12,
            Some(false) if hours == 12 => hours = 0,
            _ => {}
        }
        push_unique(found, format!("{hours:02}:{minutes:02}"));
        let end = (index + taken).min(claimed.len());
        claimed[index..end].fill(true);
    }
}

/// A whitespace-separated word of the text.
struct Word<'a> {
    text: &'a str,
}

fn words(text: &str) -> Vec<Word<'_>> {
    text.split_whitespace().map(|text| Word { text }).collect()
}

fn push_unique<T: PartialEq>(list: &mut Vec<T>, item: T) {
    if !list.contains(&item) {
        list.push(item);
    }
}

/// `word` without the punctuation that sentences put around tokens.
fn trim_punctuation(word: &str) -> &str {
    word.trim_matches(|c: char| {
        matches!(c, '(' | ')' | '[' | ']' | '<' | '>' | '"' | '\'' | ',' | ';' | ':' | '!' | '?')
    })
    .trim_end_matches('.')
}

/// The word in lowercase letters only, for keyword checks ("Tracking:" → "tracking").
fn keyword(word: &str) -> String {
    word.chars().filter(|c| c.is_alphabetic()).flat_map(char::to_lowercase).collect()
}

fn url(word: &str) -> Option<String> {
    let lower = word.to_ascii_lowercase();
    let scheme = lower.starts_with("http://") || lower.starts_with("https://") || lower.starts_with("www.");
    (scheme && word.len() > 8).then(|| word.to_owned())
}

fn email_address(word: &str) -> Option<String> {
    let word = word.strip_prefix("mailto:").unwrap_or(word);
    let (local, domain) = word.split_once('@')?;
    let local_ok = !local.is_empty() && local.chars().all(|c| c.is_alphanumeric() || "._%+-".contains(c));
    let domain_ok = domain.contains('.')
        && !domain.starts_with('.')
        && !domain.ends_with('.')
        && domain.chars().all(|c| c.is_alphanumeric() || c == '.' || c == '-');
    (local_ok && domain_ok).then(|| word.to_lowercase())
}

/// The carrier whose format `token` has, if any.
fn carrier_of(token: &str) -> Option<&'static str> {
    let upper = token.to_ascii_uppercase();
    let all_digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    if upper.len() == 18 && upper.starts_with("1Z") && upper[2..].chars().all(|c| c.is_ascii_alphanumeric()) {
        return Some("UPS");
    }
    if (20..=22).contains(&upper.len()) && all_digits(&upper) && upper.starts_with('9') {
        return Some("USPS");
    }
    if upper.len() == 15 && upper.starts_with("TBA") && all_digits(&upper[3..]) {
        return Some("Amazon");
    }
    None
}

/// Tracking numbers: a token in a carrier's format, or an alphanumeric token of
/// 8–30 characters with at least 6 digits within three words after "tracking".
fn tracking_numbers(words: &[Word<'_>], claimed: &mut [bool], found: &mut Vec<TrackingNumber>) {
    for index in 0..words.len() {
        if claimed[index] {
            continue;
        }
        let token = trim_punctuation(words[index].text).trim_start_matches('#');
        let carrier = carrier_of(token);
        let after_label = (index.saturating_sub(3)..index).any(|before| keyword(words[before].text) == "tracking");
        let plausible = (8..=30).contains(&token.len())
            && token.chars().all(|c| c.is_ascii_alphanumeric())
            && token.chars().filter(char::is_ascii_digit).count() >= 6;
        if carrier.is_some() || (after_label && plausible) {
            claimed[index] = true;
            let value = token.to_ascii_uppercase();
            if !found.iter().any(|known| known.value == value) {
                found.push(TrackingNumber { value, carrier });
            }
        }
    }
}

/// Order numbers: the first token with a digit among the three words after
/// "order" (skipping `#`, `no.`, `number`, `id`, `ref`), made of letters, digits
/// and dashes.
fn order_numbers(words: &[Word<'_>], claimed: &mut [bool], found: &mut Vec<String>) {
    for index in 0..words.len() {
        if keyword(words[index].text) != "order" || words[index].text.ends_with(['.', ',', ';']) {
            continue;
        }
        for next in index + 1..(index + 4).min(words.len()) {
            if claimed[next] {
                break;
            }
            let token = trim_punctuation(words[next].text).trim_start_matches('#');
            let label = matches!(keyword(token).as_str(), "" | "no" | "number" | "id" | "ref" | "nr");
            if label && !token.chars().any(|c| c.is_ascii_digit()) {
                continue;
            }
            let shaped = (3..=30).contains(&token.len())
                && token.chars().any(|c| c.is_ascii_digit())
                && token.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                && !token.starts_with('-');
            if shaped {
                claimed[next] = true;
                push_unique(found, token.to_owned());
            }
            break;
        }
    }
}

const MONTHS: [&str; 12] = [
    "january",
    "february",
    "march",
    "april",
    "may",
    "june",
    "july",
    "august",
    "september",
    "october",
    "november",
    "december",
];

/// The month a word names (full or three-letter form).
fn month(word: &str) -> Option<u32> {
    let word = keyword(word);
    if word.len() < 3 {
        return None;
    }
    MONTHS.iter().position(|name| *name == word || (word.len() == 3 && name.starts_with(&word))).map(|i| i as u32 + 1)
}

fn number(word: &str) -> Option<u32> {
    let digits = trim_punctuation(word).trim_end_matches(|c: char| c.is_alphabetic()); // 14th → 14
    (!digits.is_empty() && digits.len() <= 4 && digits.chars().all(|c| c.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// Dates: ISO `2025-05-14`, `14 May 2025` and `May 14, 2025`.
fn dates(words: &[Word<'_>], claimed: &mut [bool], found: &mut Vec<DateMention>) {
    let mut index = 0;
    while index < words.len() {
        let mut mention = |date: Option<NaiveDate>, span: usize, claimed: &mut [bool]| {
            let Some(date) = date else { return false };
            let text = words[index..index + span].iter().map(|w| w.text).collect::<Vec<_>>().join(" ");
            let text = trim_punctuation(&text).to_owned();
            claimed[index..index + span].iter_mut().for_each(|c| *c = true);
            let value = date.format("%Y-%m-%d").to_string();
            if !found.iter().any(|known| known.value == value) {
                found.push(DateMention { value, text });
            }
            true
        };
        if claimed[index] {
            index += 1;
            continue;
        }
        let word = trim_punctuation(words[index].text);
        if mention(NaiveDate::parse_from_str(word, "%Y-%m-%d").ok(), 1, claimed) {
            index += 1;
            continue;
        }
        let at = |offset: usize| words.get(index + offset).map(|w| w.text);
        // 14 May 2025
        if let (Some(day), Some(month), Some(year)) =
            (number(word), at(1).and_then(month), at(2).and_then(number).filter(|y| *y >= 1900))
            && mention(NaiveDate::from_ymd_opt(year as i32, month, day), 3, claimed)
        {
            index += 3;
            continue;
        }
        // May 14, 2025
        if let (Some(month), Some(day), Some(year)) =
            (month(word), at(1).and_then(number), at(2).and_then(number).filter(|y| *y >= 1900))
            && mention(NaiveDate::from_ymd_opt(year as i32, month, day), 3, claimed)
        {
            index += 3;
            continue;
        }
        index += 1;
    }
}

const SYMBOLS: [(&str, &str); 5] = [("US$", "USD"), ("$", "USD"), ("€", "EUR"), ("£", "GBP"), ("¥", "JPY")];
const CODES: [&str; 8] = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "SEK"];

/// `1,299.00` → 1299.0; `249,00` → 249.0 (a decimal comma); `1.299,00` → 1299.0.
fn parse_amount(text: &str) -> Option<f64> {
    if text.is_empty() || !text.starts_with(|c: char| c.is_ascii_digit()) {
        return None;
    }
    if !text.chars().all(|c| c.is_ascii_digit() || c == ',' || c == '.') {
        return None;
    }
    let decimal_comma = match (text.rfind(','), text.rfind('.')) {
        (Some(comma), Some(dot)) => comma > dot,
        (Some(comma), None) => text.len() - comma - 1 == 2,
        _ => false,
    };
    let normal: String = if decimal_comma { text.replace('.', "").replace(',', ".") } else { text.replace(',', "") };
    normal.parse().ok()
}

/// Amounts: a currency symbol or code before or after a number (`$39.99`,
/// `€ 249.00`, `249,00 €`, `EUR 29.90`, `39.99 USD`).
fn amounts(words: &[Word<'_>], claimed: &mut [bool], found: &mut Vec<Amount>) {
    let code = |word: &str| CODES.iter().copied().find(|code| trim_punctuation(word).eq_ignore_ascii_case(code));
    let symbol =
        |word: &str| SYMBOLS.iter().find(|(symbol, _)| trim_punctuation(word) == *symbol).map(|(_, code)| *code);
    for index in 0..words.len() {
        if claimed[index] {
            continue;
        }
        let raw = trim_punctuation(words[index].text).trim_start_matches(['(', '=']);
        // A symbol glued in front: $39.99, €249.00, -$5.00.
        let glued = raw.trim_start_matches('-');
        let prefixed = SYMBOLS.iter().find_map(|(symbol, code)| Some((glued.strip_prefix(symbol)?, *code)));
        // A symbol glued behind: 249,00€.
        let suffixed = SYMBOLS.iter().find_map(|(symbol, code)| Some((glued.strip_suffix(symbol)?, *code)));
        let (amount, currency, span) = if let Some((number, currency)) = prefixed.or(suffixed) {
            (parse_amount(number), Some(currency), index..=index)
        } else if let Some(value) = parse_amount(raw) {
            let before = index.checked_sub(1).filter(|b| !claimed[*b]).map(|b| words[b].text);
            let after = words.get(index + 1).filter(|_| !claimed.get(index + 1).copied().unwrap_or(true));
            let after = after.map(|w| w.text);
            match (before.and_then(|w| code(w).or(symbol(w))), after.and_then(|w| code(w).or(symbol(w)))) {
                (Some(currency), _) => (Some(value), Some(currency), index - 1..=index),
                (None, Some(currency)) => (Some(value), Some(currency), index..=index + 1),
                _ => (None, None, index..=index),
            }
        } else {
            (None, None, index..=index)
        };
        if let (Some(value), Some(currency)) = (amount, currency) {
            let text = words[span.clone()].iter().map(|w| trim_punctuation(w.text)).collect::<Vec<_>>().join(" ");
            claimed[span].iter_mut().for_each(|c| *c = true);
            let amount = Amount { value, currency, text };
            if !found.iter().any(|known| known.value == amount.value && known.currency == amount.currency) {
                found.push(amount);
            }
        }
    }
}

/// Whether `word` may be part of a phone number: digits and `+ ( ) - .` only.
fn phone_piece(word: &str) -> bool {
    let word = word.trim_end_matches([',', ';', '.']);
    !word.is_empty()
        && word.chars().any(|c| c.is_ascii_digit())
        && word.chars().all(|c| c.is_ascii_digit() || "+()-.".contains(c))
}

/// Phone numbers: a run of words of digits and `+ ( ) - .` with 7–15 digits that
/// starts with `+`, has separators, or follows "phone", "tel", "call" or "mobile".
fn phone_numbers(words: &[Word<'_>], claimed: &mut [bool], found: &mut Vec<String>) {
    let mut index = 0;
    while index < words.len() {
        if claimed[index] || !phone_piece(words[index].text) {
            index += 1;
            continue;
        }
        let mut end = index;
        let mut digits = 0;
        while end < words.len() && !claimed[end] && phone_piece(words[end].text) {
            let count = words[end].text.chars().filter(char::is_ascii_digit).count();
            if digits + count > 15 {
                break;
            }
            digits += count;
            end += 1;
            if words[end - 1].text.ends_with([',', ';']) {
                break;
            }
        }
        let text = words[index..end].iter().map(|w| w.text).collect::<Vec<_>>().join(" ");
        let text = text.trim_end_matches([',', ';', '.']).to_owned();
        let separated = text.contains([' ', '-', '(', '.']);
        let labelled = index
            .checked_sub(1)
            .map(|before| keyword(words[before].text))
            .is_some_and(|word| matches!(word.as_str(), "phone" | "tel" | "call" | "mobile" | "on" | "at"));
        let shaped = (text.starts_with('+') || separated || labelled) && !text.starts_with(['-', '.']);
        if (7..=15).contains(&digits) && shaped && end > index {
            claimed[index..end].iter_mut().for_each(|c| *c = true);
            push_unique(found, text);
            index = end;
        } else {
            index += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SHIPPED: &str = "Good news: your order A-10482 has shipped with UPS. Tracking number: \
        1Z999AA10123456784. Estimated delivery: Wednesday, 14 May 2025, between 10:00 and 14:00. \
        Track it at https://northwind-shop.example/track/1Z999AA10123456784 or call +49 30 1234 5678.";

    #[test]
    fn a_shipping_notice_gives_its_tracking_and_order_numbers_date_url_and_phone() {
        let found = extract(SHIPPED);
        assert_eq!(
            found.tracking_numbers,
            vec![TrackingNumber { value: "1Z999AA10123456784".into(), carrier: Some("UPS") }]
        );
        assert_eq!(found.order_numbers, vec!["A-10482"]);
        assert_eq!(found.dates, vec![DateMention { value: "2025-05-14".into(), text: "14 May 2025".into() }]);
        assert_eq!(found.urls, vec!["https://northwind-shop.example/track/1Z999AA10123456784"]);
        assert_eq!(found.phone_numbers, vec!["+49 30 1234 5678"]);
        assert!(found.amounts.is_empty(), "times and dates are not money: {:?}", found.amounts);
    }

    #[test]
    fn carriers_are_recognised_by_format_and_by_label() {
        let found = extract("USPS 9400111899223197428490, Amazon TBA304918274000, tracking ID: JD014600006281520641");
        let values: Vec<(&str, Option<&str>)> =
            found.tracking_numbers.iter().map(|t| (t.value.as_str(), t.carrier)).collect();
        assert_eq!(
            values,
            vec![
                ("9400111899223197428490", Some("USPS")),
                ("TBA304918274000", Some("Amazon")),
                ("JD014600006281520641", None)
            ]
        );
        assert!(found.phone_numbers.is_empty(), "{:?}", found.phone_numbers);
    }

    #[test]
    fn order_numbers_follow_the_word_order_with_or_without_labels() {
        let found = extract(
            "Order number: LB-55821. Your order #112-4456789-1234567 is here. Order total: $89.48. order BD-2291",
        );
        assert_eq!(found.order_numbers, vec!["LB-55821", "112-4456789-1234567", "BD-2291"]);
        assert!(found.phone_numbers.is_empty(), "an order number is not a phone: {:?}", found.phone_numbers);
    }

    #[test]
    fn amounts_carry_their_currency_in_every_spelling() {
        let found = extract("Total $89.48, chair €249.00, cushion 29,90 €, fee EUR 1,299.50, rent 1.200,00 EUR, £5");
        let values: Vec<(f64, &str)> = found.amounts.iter().map(|a| (a.value, a.currency)).collect();
        assert_eq!(
            values,
            vec![(89.48, "USD"), (249.0, "EUR"), (29.9, "EUR"), (1299.5, "EUR"), (1200.0, "EUR"), (5.0, "GBP")]
        );
        assert_eq!(found.amounts[0].text, "$89.48");
    }

    #[test]
    fn times_of_day_in_24_hour_and_am_pm_spellings() {
        let found = extract("Could we meet at 14:00 for an hour, or 9:30, or 2 pm? Not 2:30pm. Order 12:345.");
        assert_eq!(found.times, ["14:00", "09:30", "14:30"], "each once, in order; 12:345 is no time");
    }

    #[test]
    fn dates_in_three_spellings_and_addresses() {
        let found = extract("Due 2025-06-01, or May 14, 2025, or 3 June 2025. Write to Sam@BrightDesk.example.");
        let dates: Vec<&str> = found.dates.iter().map(|d| d.value.as_str()).collect();
        assert_eq!(dates, vec!["2025-06-01", "2025-05-14", "2025-06-03"]);
        assert_eq!(found.email_addresses, vec!["sam@brightdesk.example"]);
        assert!(found.phone_numbers.is_empty(), "{:?}", found.phone_numbers);
    }

    #[test]
    fn phone_numbers_need_a_shape_or_a_label() {
        let found = extract("Call me on +1 415 555 0142 or (312) 555-0199; not 20 items or 1234567.");
        assert_eq!(found.phone_numbers, vec!["+1 415 555 0142", "(312) 555-0199"]);
        assert!(extract("I have 12345678 reasons").phone_numbers.is_empty());
    }

    #[test]
    fn nothing_is_found_in_plain_prose_and_repeats_are_kept_once() {
        assert_eq!(extract("Thanks for dinner, see you soon!"), Entities::default());
        let found = extract("Tracking 1Z999AA10123456784 and again 1Z999AA10123456784");
        assert_eq!(found.tracking_numbers.len(), 1);
    }
}
